"""The README's testing example, run as written (so the README cannot rot)."""

from tf_failure_handling import testing


def test_readme_simulated_cluster_example(tmp_path):
    def worker(ctx):
        w = testing.FakeVariable(0.0)
        handler = ctx.handler(testing.FakeCheckpoint(w=w), ctx.checkpoint_dir)
        for step in range(handler.total_run_calls, 100):
            if step == 10 and ctx.index == 1 and ctx.attempt == 0:
                ctx.cluster.preempt(1)
            handler.run(lambda: w.assign_add(ctx.all_reduce(1.0)))
        return w.numpy()

    cluster = testing.SimulatedCluster(num_workers=3, root=tmp_path)
    assert {r.exit_code for r in cluster.run(worker)} == {42}
    assert {r.value for r in cluster.run(worker)} == {300.0}
