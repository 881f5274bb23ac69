"""Lesson 16: the planner with context parallelism and whole runs, the published runs it reproduces, the memory
exercise, the panel, and the calibrated prediction of a 2-rank run."""

import dataclasses

import pytest

from labtools import plan
from labtools.claims import Ledger
from labtools.parallel import launch
from labtools.plan import CLUSTERS, GPU, MODELS, Layout, Part, run_plan, step_time
from labtools.runs import MTNLG_RUN

A100, H100 = CLUSTERS[GPU.A100], CLUSTERS[GPU.H100]
LONG = dataclasses.replace(MODELS["405B"], seq=131072)


def test_a_steps_parts_add_up_and_its_model_flops_give_mfu():
    e = step_time(MODELS["405B"], H100, Layout(128, 8, 16), 2048, v=4, efficiency=0.7, dp_overlap=0.5)
    assert sum(e.breakdown.values()) == pytest.approx(e.step_s, rel=1e-12)
    assert e.dp_exposed_s == pytest.approx(0.5 * e.dp_comm_s)
    assert e.model_flops == pytest.approx(MODELS["405B"].flops_per_token() * 2048 * 8192)
    assert e.mfu == pytest.approx(e.model_flops / (e.step_s * 16384 * H100.peak_flops))
    # recomputation is hardware work, not model work: the same step with it is slower and its MFU lower
    plain = step_time(MODELS["405B"], H100, Layout(128, 8, 16), 2048, v=4, efficiency=0.7, checkpoint="none")
    assert plain.model_flops == e.model_flops and plain.compute_s == pytest.approx(e.compute_s * 6 / 8, rel=0.02)


def test_context_parallelism_splits_activations_and_gathers_only_the_kv_heads_a_tensor_rank_holds():
    two = plan.memory_per_gpu(LONG, Layout(8, 8, 16, 2))
    sixteen = plan.memory_per_gpu(LONG, Layout(1, 8, 16, 16))
    assert two.parts["activations"] == pytest.approx(8 * sixteen.parts["activations"], rel=1e-6)
    # ZeRO-1 shards over dp · cp: the same 16 replicas either way
    assert plan.memory_per_gpu(LONG, Layout(16, 8, 16, 1), zero_stage=1).model_states == pytest.approx(
        plan.memory_per_gpu(LONG, Layout(1, 8, 16, 16), zero_stage=1).model_states)
    e = step_time(LONG, H100, Layout(8, 8, 16, 16), 128, checkpoint="none")
    # forward all-gather + backward reduce-scatter of one kv head's keys and values (8 kv heads over tp 8), bf16
    kv = 131072 * 2 * 128 * 2
    per_layer = 2 * plan.collective_time("all_gather", kv, 16, H100.inter_bw, H100.latency)
    assert e.cp_comm_s == pytest.approx(per_layer * 8 * 16)  # 126 layers over 16 stages: 8 each; 16 micro-batches
    assert MODELS["405B"].kv_width == 1024 and MODELS["70B"].kv_width == 8192


@pytest.mark.parametrize("layout, match", [
    (Layout(8, 8, 16, 0), "cp"),
    (Layout(8, 8, 16, 3), "2·cp must divide the sequence"),
])
def test_bad_context_layouts_are_named(layout, match):
    with pytest.raises(ValueError, match=match):
        plan.check_layout(LONG, layout)


@pytest.mark.parametrize("kw, match", [
    (dict(efficiency=0.0), "efficiency"), (dict(efficiency=1.5), "efficiency"), (dict(dp_overlap=2.0), "dp_overlap"),
    (dict(global_batch=1001), "global batch"), (dict(v=0), "v must be"), (dict(micro_batch=0), "micro_batch"),
    (dict(layout=Layout(1024, 1, 1), global_batch=2048, require_fit=True), "does not fit"),
])
def test_planner_bad_input_is_named(kw, match):
    args = dict(model=MODELS["GPT-3 175B"], cluster=A100, layout=Layout(8, 8, 16), global_batch=1536) | kw
    with pytest.raises(ValueError, match=match):
        step_time(**args)


def test_layouts_include_context_parallel_degrees_and_fall_back_to_1f1b_where_interleaving_cannot_run():
    ranked = plan.rank_layouts(LONG, H100, 16384, 128, cp=(1, 4, 16), v=4)
    assert {e.layout.cp for e in ranked} == {1, 4, 16}
    assert all(e.layout.world == 16384 and e.layout.tp <= 8 for e in ranked)
    fitting = [e for e in ranked if e.fits]
    assert fitting and all(a.step_s <= b.step_s for a, b in zip(fitting, fitting[1:]))
    assert not any(e.fits for e in ranked if e.layout.cp == 1)  # 131,072 tokens need the sequence split
    assert {e.v for e in ranked} == {1, 4}
    assert all(e.v == 1 for e in ranked if e.micro_batches % e.layout.pp)


def test_a_whole_run_is_steps_times_step_stretched_by_failures():
    r = run_plan(MODELS["70B"], H100, Layout(512, 4, 1), 1024, 15e12, efficiency=0.75, save_s=30, restart_s=600)
    assert r.steps == -(-15e12 // (1024 * 4096))
    assert r.days == pytest.approx(r.steps * r.step.step_s / 86400)
    assert r.job_mtbf_h == pytest.approx(plan.LLAMA3_GPU_MTBF_H / 2048)
    assert r.interval_s == pytest.approx((2 * 30 * r.job_mtbf_h * 3600) ** 0.5)
    assert r.days_with_failures == pytest.approx(r.days / (1 - r.waste))
    assert r.cost == pytest.approx(r.gpu_hours * 2.0)
    bigger = run_plan(MODELS["70B"], H100, Layout(2048, 4, 1), 4096, 15e12, efficiency=0.75)
    assert bigger.waste > r.waste  # four times the GPUs fail four times as often
    with pytest.raises(ValueError, match="no time to train"):
        run_plan(MODELS["70B"], H100, Layout(512, 4, 1), 1024, 15e12, gpu_mtbf_h=10.0, save_s=600)
    with pytest.raises(ValueError, match="tokens"):
        run_plan(MODELS["70B"], H100, Layout(512, 4, 1), 1024, 0)


def test_llama3_calibrated_on_one_layout_predicts_the_next_only_with_an_interleaved_schedule():
    from lessons.plan_a_run import predicted, reproduced
    c = predicted.run()
    ledger = Ledger("t")
    predicted.findings(ledger, c)
    assert ledger.all_passed, ledger.to_text()
    for v in predicted.SCHEDULES:  # the calibration reproduces the first row exactly, whatever v
        assert c.llama3[v].rows[0].flops_per_gpu == pytest.approx(430e12, rel=1e-6)
    rates = [c.llama3[v].rows[1].flops_per_gpu for v in predicted.SCHEDULES]
    assert rates == sorted(rates)  # deeper interleaving, smaller bubble
    assert c.a100.rows[0].hardware_flops_per_gpu == pytest.approx(126e12, rel=1e-6)
    rates = [e.hardware_flops_per_gpu for e in c.a100.rows]
    assert rates == sorted(rates, reverse=True)  # more data parallelism, fewer micro-batches each: a larger bubble
    assert reproduced.gpt3_days().short_form == pytest.approx(33.9, abs=0.05)
    # MT-NLG's published step times and TFLOP/s agree with our FLOP count only with recomputation counted: the
    # model FLOPs alone (6P and attention, no second forward) fall 25% short
    counted = reproduced.run().mtnlg_tflops
    model_only = [e.model_flops / (row.step_s * e.layout.world) for row, e in zip(MTNLG_RUN.layouts, c.a100.rows)]
    for ours, plain, row in zip(counted, model_only, MTNLG_RUN.layouts):
        assert ours == pytest.approx(row.tflops * 1e12, rel=0.02)
        assert plain / (row.tflops * 1e12) == pytest.approx(0.75, abs=0.02)


def test_published_figures_come_back_from_their_papers_inputs_only_under_the_papers_conventions():
    from lessons.plan_a_run import reproduced
    c = reproduced.run()
    ledger = Ledger("t")
    reproduced.findings(ledger, c)
    assert ledger.all_passed, ledger.to_text()
    assert len(reproduced.figures(c)) == 12  # the table the reproduced_all claim reads
    # Llama 3 405B counted from its shape: 405.85B; the weights that multiply (no embedding lookup, no norm) 403.75B
    p = c.llama3_params
    assert p.total == pytest.approx(405.853e9, rel=1e-5) and p.products == pytest.approx(403.748e9, rel=1e-5)
    # attention counted whole would fail the 2% claim for both published per-token figures, and 6P without attention
    # for DeepSeek-V3's: only the causal count (half the whole) reproduces both
    for t in c.per_token.values():
        assert t.whole / t.published - 1 > 0.02
    ds = c.per_token["DeepSeek-V3"]
    assert 6 * ds.products / ds.published - 1 < -0.02


def test_mtnlg_took_more_time_per_pipeline_slot_on_wider_layouts_and_three_points_cannot_place_a_fixed_part():
    from lessons.plan_a_run import predicted
    rows = predicted.megatron()[0].rows
    line = predicted.mtnlg_line(rows)
    assert line.slots == [274, 226, 194]  # 1920 / dp micro-batches + 35 − 1
    assert line.per_slot_rise == pytest.approx(44.4 / 194 / (60.1 / 274) - 1)  # +4.3%: published step times
    # a line through three points: its intercept (6.0 s) has a standard error of 1.6 s, a 95% interval of ±20 s
    assert line.fixed_s == pytest.approx(5.98, abs=0.01) and line.fixed_se_s == pytest.approx(1.60, abs=0.01)
    assert line.fixed_ci95_s > line.fixed_s  # the interval includes no fixed part at all
    # the planner's step, calibrated on the first row, is (nearly) proportional to the slots: constant per slot
    ratio = [e.step_s / x for e, x in zip(rows, line.slots)]
    assert max(ratio) / min(ratio) < 1.02


def test_a_prediction_of_another_layout_held_to_the_papers_2_percent_would_fail():
    from lessons.plan_a_run import predicted
    c = predicted.run()
    ledger = Ledger("t")
    predicted.findings(ledger, c)
    errors = ledger.notes["cross_layout_errors"]
    assert max(abs(e) for e in errors.values()) > 0.02  # the 10% of cross-layout predictions is not slack on 2%
    assert sum(abs(e) > 0.05 for e in errors.values()) >= 2


def test_the_example_ranks_fitting_layouts_first_and_says_why_the_best_wins():
    from lessons.plan_a_run import example
    p = example.plan()
    fitting = [e for e in p.ranked if e.fits]
    assert p.best is fitting[0] and p.run.step.layout == p.best.layout
    second, part = example.why(p)
    assert second is fitting[1] and part in Part
    assert second.breakdown[part] > p.best.breakdown[part]
    text = example.findings(Ledger("t"), p)
    assert str(p.best.layout) in text
    assert f"{p.run.days_with_failures:.0f} days" in example.run_findings(p)  # section 2 answers how long


def test_the_panel_names_a_layout_the_gpus_cannot_hold_and_marks_a_good_one():
    from lessons.plan_a_run import planner
    h100 = GPU.H100
    fig = planner.draw("405B", 131072, 16384, 128, 15.6, 8, 16, 3, 4, "block", 0.75, h100)
    assert "do not divide" in fig.layout.title.text
    fig = planner.draw("405B", 131072, 16384, 128, 15.6, 8, 16, 16, 4, "block", 0.75, h100)
    assert "yours, dp 8 × tp 8 × pp 16 × cp 16" in fig.layout.title.text and "days" in fig.layout.title.text
    assert any(y.startswith("→ ") for y in fig.data[0].y)
    fig = planner.draw("7B", 4096, 64, 256, 1.0, 8, 1, 1, 1, "block", 0.75, h100)
    assert "yours, dp 8 × tp 8 × pp 1" in fig.layout.title.text
    panel = planner.panel()
    assert panel.controls["model"].value == "70B" and panel.controls["gpus"].value == 2048


def test_lesson_16_memory_solution_passes_and_forgetting_cp_in_the_sharding_fails_with_the_hint():
    from lessons.plan_a_run import memory_exercise as m
    assert m.check_model_states(m.reference).passed

    def zero_over_dp_only(n_params, layout, zero_stage):
        return m.reference(n_params, Layout(layout.dp, layout.tp, layout.pp), zero_stage)

    out = m.check_model_states(zero_over_dp_only)
    assert out.status == "fail" and "cp = 128 ranks" in out.message and "405B" in out.message

    def eighteen_bytes(n_params, layout, zero_stage):
        return m.reference(n_params, layout, zero_stage) * 18 / 16

    out = m.check_model_states(eighteen_bytes)
    assert "7B on 8 GPUs" in out.message
    # with its unit and a size a reader can hold: 16 bytes of each of the 7B model's parameters
    assert "expected 112,000,000,000 bytes (112.00 GB), got 126,000,000,000 bytes (126.00 GB)" in out.message, \
        out.message


def _calibration(together=0.010, ddp=0.016, sharded=0.030, solo=0.008, sharded_alone=0.009):
    """A calibration's measurements: collectives whose seconds lie on the lines of α = 0.5 ms per ring step and
    β = 1 GB/s (all-reduce and all-gather) or 0.5 GB/s (reduce-scatter, as slow per byte sent as gloo's)."""
    from labtools.plan import collective_bytes, collective_steps
    from lessons.plan_a_run.ranks import Calibration, Collective, Run, RunSteps, Timed
    sizes = (2**14, 2**17, 2**20, 2**22)
    beta = {Collective.ALL_REDUCE: 1e9, Collective.ALL_GATHER: 1e9, Collective.REDUCE_SCATTER: 0.5e9}
    colls = {k: {b: collective_steps(k, 2) * 5e-4 + collective_bytes(k, b, 2) / beta[k] for b in sizes}
             for k in beta}
    once = lambda t: Timed(rounds=[t], median=t)  # noqa: E731
    return Calibration(peak=once(50e9), solo=once(solo),
                       runs={Run.DDP: RunSteps(step=once(ddp), compute=once(together)),
                             Run.ZERO2: RunSteps(step=once(sharded), compute=once(sharded_alone))},
                       collectives=colls, n_params=2_000_000, world=2, vocab=65, bucket_cap_mb=1024.0)


def test_the_calibration_fits_each_collective_and_predicts_the_communication_of_runs_it_did_not_measure():
    from lessons.plan_a_run import calibration, settings
    from lessons.plan_a_run.ranks import Collective, Run
    S = settings("smoke")
    r = _calibration()
    costs = calibration.fit(r)
    assert costs[Collective.ALL_REDUCE].latency == pytest.approx(5e-4, rel=1e-6)
    assert costs[Collective.REDUCE_SCATTER].bandwidth == pytest.approx(0.5e9, rel=1e-6)
    p = calibration.predict(S, r)
    ddp, z2 = p.estimates[Run.DDP], p.estimates[Run.ZERO2]
    # each run's compute: its own step with nothing sent, every rank at once
    assert ddp.compute_s == pytest.approx(0.010) and z2.compute_s == pytest.approx(0.009)
    assert calibration.predict(S, r, one_rank_alone=True).estimates[Run.ZERO2].compute_s == pytest.approx(0.008)
    M = 4 * r.n_params  # fp32 gradients, one bucket: one all-reduce, two ring steps, each rank sends 2(N−1)/N·M
    assert ddp.dp_exposed_s == pytest.approx(2 * 5e-4 + M / 1e9)
    # ZeRO-2: a reduce-scatter of the gradients and an all-gather of the weights, each (N−1)/N·M at its own β
    assert z2.dp_exposed_s == pytest.approx(5e-4 + M / 2 / 0.5e9 + 5e-4 + M / 2 / 1e9)
    # a run within 25% of each prediction passes; the claims read the run, not the prediction
    r = _calibration(ddp=ddp.step_s * 1.1, sharded=z2.step_s * 0.9)
    ledger = Ledger("t")
    said = calibration.findings(ledger, S, r, calibration.predict(S, r))
    assert ledger.all_passed, ledger.to_text()
    assert said.statements[0].startswith("Roughly: with each step's compute measured")
    assert "| the communication alone (the step less its measured compute) |" in str(said)
    # a ZeRO-2 run twice as slow as predicted fails its claim, and not the other; the answer in words says so
    r = _calibration(ddp=ddp.step_s, sharded=z2.step_s * 2)
    ledger = Ledger("t")
    said = calibration.findings(ledger, S, r, calibration.predict(S, r))
    assert [c.passed for c in ledger.claims] == [True, False, True]
    assert said.statements[0].startswith("Not this time: it missed the ZeRO-2 step by **50%**"), said.statements[0]
    # runs whose steps are nearly all compute: the compute-only planner is not refuted, and the answer says so
    r = _calibration(ddp=0.0105, sharded=0.011)
    ledger = Ledger("t")
    said = calibration.findings(ledger, S, r, calibration.predict(S, r))
    assert not ledger.claims[2].passed
    assert said.statements[0].startswith(("This run cannot tell", "Not this time")), said.statements[0]


@pytest.mark.ranks
def test_calibration_runs_on_two_ranks(session_run_root):
    from lessons.plan_a_run import ranks
    from lessons.plan_a_run.ranks import CalibrationJob
    from test_dist import wait_gone

    job = CalibrationJob(n_layer=1, n_embd=32, n_head=4, block_size=16, batch_size=2, steps=1, rounds=2,
                         matmul_sizes=(64,), repeats=2, message_sizes=(2**10, 2**12))
    res = launch(ranks.calibrate, 2, job, show_progress=False)
    assert wait_gone(session_run_root) == []
    r0 = res[0]
    assert len(r0.peak.rounds) == 2 and res[1].peak.rounds == []  # rank 0 alone calibrates compute
    assert len(r0.solo.rounds) == 2 and res[1].solo.rounds == [] and res[1].solo.median is None
    assert set(r0.runs) == set(ranks.Run)
    assert all(t > 0 for steps in r0.runs.values() for t in steps.step.rounds + steps.compute.rounds)
    assert set(r0.collectives) == set(ranks.Collective)
    assert all(set(sizes) == {2**10, 2**12} and all(t > 0 for t in sizes.values()) for sizes in r0.collectives.values())
    assert r0.bucket_cap_mb == ranks.BUCKET_MB  # one bucket: the all-reduce after backward
    from labtools.config import build_gpt
    assert r0.n_params == build_gpt(job).num_params() and r0.world == 2


@pytest.mark.ranks
def test_the_sharded_step_trains_as_adamw_on_the_whole_batch_in_one_process(session_run_root):
    from lessons.plan_a_run import ranks
    from lessons.plan_a_run.ranks import CalibrationJob
    from test_dist import wait_gone

    job = CalibrationJob(n_layer=1, n_embd=32, n_head=4, block_size=16, batch_size=2, steps=3, lr=1e-3)
    res = launch(ranks.sharded_parity, 2, job, show_progress=False)
    assert wait_gone(session_run_root) == []
    # Adam moves every weight by about lr per step whatever its gradient's size: summation-order rounding in a small
    # gradient shows at that scale, so the bound is a hundredth of lr
    assert max(r.max_diff for r in res) < 1e-5


def test_every_layout_claims_fail_on_a_row_that_left_one_process_or_a_prediction_missing_a_part():
    """Section 6's claims and answer from its rows: all within 1e-5 and bytes as planned pass; one row whose
    weights parted (a planted bug's size) fails the first and turns the answer to 'No'; bytes measured against a
    planner that leaves out tensor parallelism's all-reduces fail the second."""
    from labtools.parallel.nd import LayoutRun, predicted_bytes
    from lessons import plan_a_run
    from lessons.plan_a_run import every_layout
    S = plan_a_run.settings("smoke")

    def row(layout, loss_rel, param_rel, ratio=1.05, held=1.13):
        return LayoutRun(layout=layout, losses=[3.0, 2.9, 2.8], reference=[3.0, 2.9, 2.8], loss_rel=loss_rel,
                         param_rel=param_rel, worst_param="transformer.h.0.attn.c_attn.weight", params=123_456,
                         wire_bytes=ratio * every_layout.predicted(S, layout),
                         state_bytes=held * every_layout.predicted_states(S, layout))

    def claim(ledger, key):
        return next(c for c in ledger.claims if c.key == key)

    good = [row("dp 2 × tp 2", 6e-8, 1.7e-7), row("tp 2 × pp 2", 1e-7, 1.7e-7, 1.14)]
    ledger = Ledger("16_plan_a_run")
    text = str(every_layout.findings(ledger, S, good))
    assert claim(ledger, "every_layout_equal").passed and claim(ledger, "bytes_as_planned").passed
    assert text.startswith("- Yes") and "predicts it" in text
    bad = [*good, row("tp 2 × cp 2", 2e-3, 0.33)]
    ledger = Ledger("16_plan_a_run")
    text = str(every_layout.findings(ledger, S, bad))
    assert not claim(ledger, "every_layout_equal").passed and text.startswith("- No")
    assert "Not every layout" in every_layout.table(S, bad).layout.title.text
    # a planner without tensor parallelism's all-reduces: dp 2 × tp 2 sends about twice what it would predict
    parts = predicted_bytes(every_layout.job(S, dict(dp=2, tp=2)))
    no_tp = sum(parts.values()) / (sum(parts.values()) - parts["tp"]) * 1.05
    ledger = Ledger("16_plan_a_run")
    text = str(every_layout.findings(ledger, S, [row("dp 2 × tp 2", 6e-8, 1.7e-7, no_tp), good[1]]))
    assert not claim(ledger, "bytes_as_planned").passed and "missed `dp 2 × tp 2`" in text
    # a rank holding twice the planner's states (a sharding that did not happen) fails the states claim
    ledger = Ledger("16_plan_a_run")
    text = str(every_layout.findings(ledger, S, [row("fsdp 2 × tp 2", 6e-8, 1.7e-7, held=2.0), good[1]]))
    assert not claim(ledger, "states_as_planned").passed and "is not what the planner counts" in text
