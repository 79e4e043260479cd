"""The stand-in images' memory rule of the local executor (experiments.scale.memory)."""

from experiments.scale import memory


def test_the_machines_memory_is_the_least_of_its_own_and_its_cgroups_limits_v2_and_v1(tmp_path):
    """A Slurm job's ``--mem`` (cgroup v2: the job's ``memory.max`` above its step's) or a container's limit (v1)
    caps what the runs may hold; "max" and v1's unset value do not; without cgroups, the machine's memory."""
    proc, cgroups = tmp_path / "proc", tmp_path / "cgroup"
    proc.mkdir()
    (proc / "cgroup").write_text("0::/system.slice/slurmstepd.scope/job_7/step_0\n")
    job = cgroups / "system.slice" / "slurmstepd.scope" / "job_7"
    (job / "step_0").mkdir(parents=True)
    (job / "step_0" / "memory.max").write_text("max\n")
    (job / "memory.max").write_text(f"{64 * 2 ** 30}\n")
    (cgroups / "memory.max").write_text("max\n")
    assert memory.cgroup_limits(proc, cgroups) == [64 * 2 ** 30]
    physical = memory.machine_memory(tmp_path / "none", cgroups)
    assert physical > 0 and memory.cgroup_limits(tmp_path / "none", cgroups) == []
    assert memory.machine_memory(proc, cgroups) == min(physical, 64 * 2 ** 30)

    (proc / "cgroup").write_text("5:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/\n")
    (cgroups / "memory" / "docker" / "abc").mkdir(parents=True)
    (cgroups / "memory" / "docker" / "abc" / "memory.limit_in_bytes").write_text(f"{2 ** 30}\n")
    (cgroups / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert sorted(memory.cgroup_limits(proc, cgroups)) == [2 ** 30, 9223372036854771712]
    assert memory.machine_memory(proc, cgroups) == 2 ** 30
