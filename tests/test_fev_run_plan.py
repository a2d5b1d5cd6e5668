"""The pure pieces of a fev benchmark's plan and words (:mod:`distributed_onnx.evaluation.fev_tasks.run_plan`,
:mod:`~distributed_onnx.evaluation.fev_tasks.reasons`): the runs go set of checkpoints by set, so one set's pool is
released before the next one's starts; the closing line counts the failed and rejected pairs and says what to do
for each. The benchmark runs that meet them are in tests/test_fev_benchmark.py."""

from __future__ import annotations

from distributed_onnx.evaluation.fev_tasks.reasons import unfinished_line
from distributed_onnx.evaluation.fev_tasks.run_plan import Run, RunKey, set_by_set
from distributed_onnx.location import Location


def _run(step: int, models: tuple[str, ...]) -> Run:
    return Run(RunKey(step, 64, (), (), models), ())


def test_runs_go_set_by_set_in_the_order_each_set_first_appears() -> None:
    runs = [_run(60, ("a", "b")), _run(30, ("a",)), _run(15, ("a", "b")), _run(5, ("a",)), _run(1, ("c",))]
    ordered = set_by_set(runs)
    assert [(run.key.models, run.key.step_minutes) for run in ordered] == [
        (("a", "b"), 60),
        (("a", "b"), 15),
        (("a",), 30),
        (("a",), 5),
        (("c",), 1),
    ]


def test_the_closing_line_says_what_to_do_for_failed_and_for_rejected_pairs() -> None:
    failed = [{"task": "t1", "model": "m", "reason": "gone"}, {"task": "t2", "model": "m", "reason": "gone"}]
    rejected = [{"task": "t3", "model": "m", "reason": "fev rejects the task: ValueError: late"}]
    output = Location.parse("/tmp/out")
    both = unfinished_line(failed, rejected, output)
    assert both == (
        "2 task x checkpoint pair(s) failed (e.g. t1 x m: gone); 1 task x checkpoint pair(s) rejected (e.g. t3 x m: "
        f"fev rejects the task: ValueError: late); the others' summaries are in {output / 'summaries.jsonl'}; "
        "rerun to retry the failed ones and fix or drop the rejected tasks (a rerun rejects them again)"
    )
    only_rejected = unfinished_line([], rejected, output)
    assert "failed" not in only_rejected.split(";")[0]
    assert only_rejected.endswith("fix or drop the rejected tasks (a rerun rejects them again)")
