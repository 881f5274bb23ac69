"""Lesson 07's component exercise, a DDP written out, on real ranks against DistributedDataParallel: the solution
passes; forgetting the broadcast, summing instead of averaging, buckets in the wrong order, and all-reduces started
after backward each fail with the hint that names them; the stub launches nothing."""

import pytest

from learner_files import load
from lessons import data_parallel
from lessons.data_parallel import ddp_exercise as dx

S = data_parallel.settings("smoke")
SOLUTION = dx.solution_source()


def variant(tmp_path, *edits: tuple[str, str]):
    """The solution with some lines changed, as a class whose source inspect can read (sent to the ranks)."""
    source = SOLUTION
    for old, new in edits:
        assert old in source, old
        source = source.replace(old, new)
    return load(tmp_path, "import torch\nimport torch.distributed as dist\n\n" + source, "MyDDP")


@pytest.mark.ranks
def test_the_solution_matches_ddp_buckets_gradients_and_overlap(tmp_path):
    out = dx.check(variant(tmp_path), S)
    assert out.passed and "the same buckets" in out.message, out.message


def test_the_stub_launches_nothing(tmp_path):
    stub = variant(tmp_path, ("    def finish(self):\n", "    def finish(self):\n        raise NotImplementedError\n"))
    assert dx.check(stub, S).status == "not written"


MISTAKES = {
    "no broadcast": ([("            dist.broadcast(p.data, src=0)", "            pass")], "broadcast them"),
    "a sum, not a mean": ([("flat.div(n)", "flat")], "the mean of the ranks' gradients"),
    "buckets first to last": ([("for p in reversed(list(model.parameters())):", "for p in list(model.parameters()):")],
                              "last to first"),
    "all-reduce after backward": ([
        ("            self.works.append((i, flat, dist.all_reduce(flat, async_op=True)))",
         "            self.works.append((i, flat, None))"),
        ("            work.wait()", "            dist.all_reduce(flat)")], "overlaps the rest of backward"),
    "an all-reduce that blocks in the hook": ([
        ("            self.works.append((i, flat, dist.all_reduce(flat, async_op=True)))",
         "            dist.all_reduce(flat)\n            self.works.append((i, flat, None))"),
        ("            work.wait()", "            pass")], "made backward wait"),
    "the mean never put back": ([("                p.grad.copy_(g.view_as(p))", "                pass")],
                                "put the mean back into every p.grad"),
}


@pytest.mark.ranks
@pytest.mark.parametrize("mistake", MISTAKES)
def test_each_mistake_fails_with_the_hint_that_names_it(tmp_path, mistake):
    edits, hint = MISTAKES[mistake]
    out = dx.check(variant(tmp_path, *edits), S)
    assert out.status == "fail" and hint in out.message, out.message
