"""Lesson 08's component exercise, a ZeRO-style sharded AdamW written out, on real ranks against torch's AdamW on
all-reduced gradients: the solution passes; a sum for a mean, a shard of the wrong numbers, an update that never
leaves its rank, and moments kept whole each fail with the hint that names them; the stub launches nothing."""

import pytest

from learner_files import load
from lessons import fsdp_zero
from lessons.fsdp_zero import sharded_exercise as sx

S = fsdp_zero.settings("smoke")
SOLUTION = sx.solution_source()


def variant(tmp_path, *edits: tuple[str, str]):
    source = SOLUTION
    for old, new in edits:
        assert old in source, old
        source = source.replace(old, new)
    return load(tmp_path, "import math\n\nimport torch\nimport torch.distributed as dist\n\n" + source,
                "MyShardedAdamW")


@pytest.mark.ranks
def test_the_solution_matches_adamw_and_keeps_one_shard_of_state(tmp_path):
    out = sx.check(variant(tmp_path), S)
    assert out.passed and f"1/{sx.WORLD}" in out.message, out.message


def test_the_stub_launches_nothing(tmp_path):
    stub = variant(tmp_path, ("    def zero_grad(self):\n",
                              "    def zero_grad(self):\n        raise NotImplementedError\n"))
    assert sx.check(stub, S).status == "not written"


MISTAKES = {
    "a sum, not a mean": ([("        grad /= self.n", "        pass")], "divide by N"),
    "another rank's shard": ([("[self.r * self.shard:(self.r + 1) * self.shard]", "[:self.shard]")],
                             "its shard of the gradient"),
    "the update stays on its rank": ([("        dist.all_gather_into_tensor(everything, theta)",
                                       "        everything = self._flat([p.detach() for p in self.params])\n"
                                       "        everything[self.r * self.shard:(self.r + 1) * self.shard] = theta")],
                                     "all-gather the shards"),
    "no weight decay": ([("theta * (1 - self.lr * self.wd)", "theta")], "decay the weights themselves"),
    "an all-reduce, then its slice": ([("        dist.reduce_scatter_tensor(grad, self._flat([p.grad for p in self.params]))"
                                        "  # my shard, summed",
                                        "        full = self._flat([p.grad for p in self.params])\n"
                                        "        dist.all_reduce(full)\n"
                                        "        grad = full[self.r * self.shard:(self.r + 1) * self.shard]")],
                                      "all_reduce is not allowed"),
    "no padding": ([("self.shard = math.ceil(total / self.n)", "self.shard = total // self.n"),
                    ("self.pad = self.shard * self.n - total", "self.pad = 0")], "line"),
    "the step counted after the update": ([("        self.t += 1\n", ""),
                                           ("        everything = torch.empty", "        self.t += 1\n"
                                            "        everything = torch.empty")], "count the step"),
    "moments kept whole": ([('self.state = {"exp_avg": torch.zeros(self.shard), "exp_avg_sq": torch.zeros(self.shard)}',
                             'self.state = {"exp_avg": torch.zeros(self.shard), "exp_avg_sq": torch.zeros(self.shard),'
                             ' "copy": torch.zeros(self.shard * self.n * 2)}')], "its own shard only"),
}


@pytest.mark.ranks
@pytest.mark.parametrize("mistake", MISTAKES)
def test_each_mistake_fails_with_the_hint_that_names_it(tmp_path, mistake):
    edits, hint = MISTAKES[mistake]
    out = sx.check(variant(tmp_path, *edits), S)
    assert out.status == "fail" and hint in out.message, out.message
