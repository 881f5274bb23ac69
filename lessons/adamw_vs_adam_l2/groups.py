"""Lesson 01, section 2: the tiny GPT trained with the same λ, measured per parameter group."""

import math

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from labtools import plots
from labtools.claims import Findings, Ledger, at_least
from labtools.schedules import bind, warmup_cosine
from labtools.train import History, StepInfo, TrainConfig, train
from lessons.adamw_vs_adam_l2 import OPTIMIZERS, Settings, build_model, corpus


def role(name: str) -> str:
    """Parameter group of a GPT parameter name: embeddings, attention, mlp or norms."""
    if ".attn." in name:
        return "attention"
    if ".mlp." in name:
        return "mlp"
    if "ln_" in name:
        return "norms"
    return "embeddings"  # wte (tied with the LM head) and wpe


ROLES = ("embeddings", "attention", "mlp", "norms")
NAMES = {"embeddings": "embedding", "attention": "attention", "mlp": "MLP", "norms": "LayerNorm"}  # for sentences


def group_probe(every: int):
    """A train() callback logging, per parameter group, the weight norm and Adam's decay amplification
    A = Σθ²/(√v̂+ε) / Σθ²: the λθ term of Adam + L2 is divided by √v̂+ε, so its decay is A·lr·λ per
    step, where AdamW's is exactly lr·λ (A = 1). Also Σ(λθ)² / Σv̂: how much of Adam + L2's v̂ is the decay
    term's own square (near 1: v̂ ≈ (λθ)², so A ≈ 1/(λ|θ|), the toy's cap — not gradient history)."""

    def probe(info: StepInfo):
        if info.step % every and info.step != 0:
            return
        opt = info.optimizer
        names = {id(p): n for n, p in info.model.named_parameters()}
        sq, amp = {r: 0.0 for r in ROLES}, {r: 0.0 for r in ROLES}
        decay2, v_sum = {r: 0.0 for r in ROLES}, {r: 0.0 for r in ROLES}
        for group in opt.param_groups:
            beta2, eps, wd = group["betas"][1], group["eps"], group["weight_decay"]
            for p in group["params"]:
                r = role(names[id(p)])
                state = opt.state[p]
                v_hat = state["exp_avg_sq"] / (1 - beta2 ** state["step"])
                theta2 = p.detach() ** 2
                sq[r] += theta2.sum().item()
                amp[r] += (theta2 / (v_hat.sqrt() + eps)).sum().item()
                decay2[r] += (wd**2 * theta2).sum().item()
                v_sum[r] += v_hat.sum().item()
        info.log["probe_step"] = info.step
        info.log["norm"] = {r: math.sqrt(sq[r]) for r in ROLES}                # one {group: value} per probe
        info.log["amplification"] = {r: amp[r] / sq[r] for r in ROLES}
        info.log["decay_share"] = {r: decay2[r] / v_sum[r] for r in ROLES}    # (λθ)² ÷ v̂, summed over the group

    return probe


def train_run(S: Settings, opt_name: str, lr: float, wd: float, steps: int, *, betas=(0.9, 0.95),
              decay_everything: bool = False, callback=None, desc: str = "", grad_clip: float | None = 1.0,
              warmup: int | None = None, hooks=None, evals: int = 10, **run_kw) -> History:
    """One training run on the small text corpus with warmup + cosine (or just warmup if warmup is given), with
    `evals` validation estimates after the one at step 0 (each costs ten forward passes); run_kw go to TrainConfig
    (checkpoint_dir, stop_at: a run saved part-way and continued)."""
    text = corpus(S)
    model = build_model(S, text.vocab_size)
    if hooks is not None:
        hooks(model)
    params = model.parameters() if decay_everything else [
        {"params": [p for p in model.parameters() if p.dim() >= 2], "weight_decay": wd},
        {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}]
    optimizer = OPTIMIZERS[opt_name](params, lr=lr, betas=betas, weight_decay=wd)
    if warmup is None:
        schedule = bind(warmup_cosine, warmup=max(1, steps // 10), total=steps, min_ratio=0.1)
    else:
        schedule = lambda s: min(1.0, (s + 1) / warmup)  # noqa: E731
    cfg = TrainConfig(steps=steps, batch_size=S.batch_size, block_size=S.block_size, lr=lr, lr_schedule=schedule,
                      eval_every=max(1, steps // evals), seed=S.seed, grad_clip=grad_clip, desc=desc or opt_name,
                      **run_kw)
    return train(model, text, cfg, optimizer=optimizer, callback=callback)


def compare(S: Settings) -> dict[str, History]:
    """Adam + L2 and AdamW at the same lr and λ, decaying every parameter, with the group probe."""
    every = max(1, S.compare_steps // 30)
    return {name: train_run(S, name, S.compare_lr, S.weight_decay, S.compare_steps, decay_everything=True,
                            callback=group_probe(every), desc=f"{name} λ={S.weight_decay:g}", evals=5)
            for name in OPTIMIZERS}


def figure(runs: dict[str, History]) -> go.Figure:
    fig = make_subplots(rows=1, cols=2, subplot_titles=("weight norm per group", "decay relative to AdamW's ηλ"))
    for i, r in enumerate(ROLES):
        for name, dash in (("AdamW", "solid"), ("AdamL2", "dash")):
            h = runs[name]
            fig.add_trace(go.Scatter(x=h.extra["probe_step"], y=[d[r] for d in h.extra["norm"]], mode="lines",
                                     name=f"{r} · {name}", legendgroup=r, line=dict(color=plots.color(i), dash=dash)),
                          row=1, col=1)
        h = runs["AdamL2"]
        fig.add_trace(go.Scatter(x=h.extra["probe_step"], y=[d[r] for d in h.extra["amplification"]], mode="lines",
                                 name=f"{r} · AdamL2 A", legendgroup=r, showlegend=False,
                                 line=dict(color=plots.color(i), dash="dash")), row=1, col=2)
    plots.marked_line(fig, y=1.0, text="AdamW (A = 1)", log=True, row=1, col=2, line=dict(dash="dot"))
    fig.update_yaxes(type="log", title_text="A = Σθ²/(√v̂+ε) / Σθ²", row=1, col=2)
    fig.update_yaxes(title_text="‖θ‖", row=1, col=1)
    fig.update_xaxes(title_text="step")
    plots.style(fig, "Where weight decay acts: each group's weight norm, and its decay beside AdamW's", height=430)
    return fig


def final_amplification(h: History) -> dict[str, float]:
    return dict(h.extra["amplification"][-1])


def findings(ledger: Ledger, S: Settings, runs: dict[str, History]) -> Findings:
    amp = final_amplification(runs["AdamL2"])
    order = sorted(amp, key=amp.get)
    mlp_w, mlp_l2 = runs["AdamW"].extra["norm"][-1]["mlp"], runs["AdamL2"].extra["norm"][-1]["mlp"]
    ledger.add("gpt_uneven", "GPT: Adam + L2 decays parameter groups unevenly (max ÷ min of A over groups, end of "
               "training)", max(amp.values()) / min(amp.values()), at_least(3), kind="measured")
    ledger.add("gpt_stronger", f"GPT: at the same λ = {S.weight_decay:g}, Adam + L2 shrinks the weights more than "
               "AdamW (AdamW's final ‖θ‖ of the MLP ÷ Adam + L2's)", mlp_w / mlp_l2, at_least(1.2), kind="measured")
    share = dict(runs["AdamL2"].extra["decay_share"][-1])
    ledger.note("amplification", amp)
    ledger.note("decay_share_of_v", share)
    least, most = order[0], order[-1]
    why = (f"The decay term fills its own denominator there: (λθ)² is {share[least]:.0%} of the group's v̂, so A "
           "cannot exceed about 1/(λ|θ|), the cap the toy showed at small σ." if share[least] > 0.5 else
           f"Its gradients dominate v̂ there ((λθ)² is {share[least]:.0%} of it): a large gradient history shields "
           "it from the decay.")
    norms = {name: runs[name].extra["norm"][-1] for name in ("AdamL2", "AdamW")}
    table = ("| group | A under Adam + L2 | ‖θ‖ Adam + L2 | ‖θ‖ AdamW |\n|---|---|---|---|\n"
             + "\n".join(f"| {r} | {amp[r]:.0f}× | {norms['AdamL2'][r]:.2f} | {norms['AdamW'][r]:.2f} |"
                         for r in order))
    return Findings([
        f"Very different things under Adam + L2: it decayed the {NAMES[most]} weights **{amp[most] / amp[least]:.0f}×**"
        f" as fast as the {NAMES[least]} weights, where AdamW treats every group alike.",
        f"At the same λ it also shrank the weights far more: the MLP's ‖θ‖ ended **{mlp_w / mlp_l2:.0f}×** smaller "
        "than under AdamW.",
    ], [
        table,
        f"Final validation loss: {runs['AdamL2'].final_val_loss:.3f} under Adam + L2, "
        f"{runs['AdamW'].final_val_loss:.3f} under AdamW.",
        f"The {least} group was decayed least. {why}",
    ])
