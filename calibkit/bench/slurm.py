"""``--executor slurm``: a bench's (or a tuning's) runs as SLURM job arrays.

The executor decides *where* a run key executes; *what* runs is unchanged: array task ``i`` runs
one ordinary command, ``python -m calibkit bench ... --run-key KEY`` (``tune ... --run-key`` for a
candidate), which executes exactly that run and writes ``RUN_DIR/result.json``
(:mod:`calibkit.bench.resultfiles`) instead of opening ``runs.db``. ``--collect`` imports the files.

One array per stage and resource shape, written to ``OUT/slurm/NNN-<stage>.sh`` with the index ->
key map beside it (``NNN-<stage>.keys``: ``INDEX KEY`` per line; ``NNN`` numbers submissions):

* ``ce``: the CE runs (index = the seed's position); ``train``: the other one-stage methods;
* ``maccal`` and ``csm``: one array each, indexed like ``ce``, ``--dependency=aftercorr`` on the
  CE array (task ``i`` starts once CE task ``i`` succeeded; SLURM makes a task whose CE is not in
  that array wait for the whole array). MaC-Cal's stage 2 is single-process: its array asks for
  at most one GPU and runs no ``torchrun``;
* tuning: ``tune-ce`` (the CE candidate), ``tune-train``, ``tune-maccal``/``tune-csm`` (after
  ``tune-ce``), then ``tune-select``, one job that selects from the candidate files (after all
  of them), then, for ``bench --tune``, the bench arrays after the selection.

A run already ``done`` (its result file) or queued/running in ``squeue`` is not submitted again,
so running the same command after a failure or a cancellation submits exactly what is missing.

Dependencies that can never be met (decided here; docs/cluster.md): a task that depends on another
(``aftercorr``/``afterok``) is submitted with ``--kill-on-invalid-dep=yes``, so that SLURM cancels
it as soon as the task it waits for ends without success (failed, cancelled, timed out): the queue
empties by itself and the same submission command submits the upstream run and its dependents
again. A dependent left pending anyway (submitted by an older calibkit, or a cluster that keeps
such jobs) is what ``squeue`` calls ``PENDING`` with the reason ``DependencyNeverSatisfied``: its
state is ``stuck`` (``--status`` says "stuck: its dependency failed", ``--collect`` counts it as
missing and exits 1), and the submission command cancels it (``scancel``) before submitting it again.
With ``--gpus-per-run N > 1`` a task asks for N GPUs and runs
``python -m torch.distributed.run --standalone --nproc_per_node N -m calibkit ...``.

Preemption (``--requeue --signal S``): SLURM sends SIGUSR1 to the batch shell S seconds before the
time limit; the script forwards it to the calibkit processes, which finish the epoch in progress,
write its checkpoint (:mod:`calibkit.train.preempt`), requeue their own array task with
``scontrol requeue`` and exit; the requeued task resumes from ``checkpoint.pt``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from calibkit.bench import resultfiles as R
from calibkit.bench import slurm_values as V
from calibkit.errors import UserError, UserRuntimeError

# squeue states of a task that runs; every other state squeue lists counts as queued, except ...
RUNNING = {"RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT"}
# ... a pending task whose dependency can never be satisfied: squeue_states calls it STUCK.
STUCK = "STUCK"
NEVER_REASON = "DependencyNeverSatisfied"
# A stage name (a file name, a shell variable of the submit script): ce, train, maccal, csm, tune-*.
_STAGE = re.compile(r"[a-z][a-z0-9-]*")
# A job to depend on: a job id, a task of an array (JOB_INDEX), or a dry run's $variable.
_JOB = re.compile(r"\d+(?:_\d+)?|\$[a-z_][a-z0-9_]*")


@dataclass(frozen=True)
class SlurmOptions:
    """The resources and scheduling options every array asks for (``sbatch`` directives).

    :meth:`validate` checks every field for what SLURM reads there and for control characters
    (:mod:`calibkit.bench.slurm_values`); :func:`script_text` calls it again before writing.
    """

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str | None = None
    gpus_per_run: int = 0
    cpus_per_run: int = 1
    mem: str | None = None
    array_parallelism: int | None = None
    sbatch_args: tuple[str, ...] = ()
    requeue: bool = False
    signal_s: int | None = None

    def validate(self) -> SlurmOptions:
        """Raises ValueError naming the first option that SLURM would not read as meant."""
        V.check_count("--gpus-per-run", self.gpus_per_run, 0)
        V.check_count("--cpus-per-run", self.cpus_per_run, 1)
        if self.array_parallelism is not None:
            V.check_count("--array-parallelism", self.array_parallelism, 1)
        if self.signal_s is not None:
            V.check_count("--signal", self.signal_s, 1, " second")
        for option, value in (("--partition", self.partition), ("--account", self.account), ("--qos", self.qos)):
            if value:  # None or "": not asked for (directives() leaves it out)
                V.check_name(option, value, several=option == "--partition")
        if self.time:
            V.check_time(self.time)
        if self.mem:
            V.check_mem(self.mem)
        if isinstance(self.sbatch_args, str):
            raise UserError("--sbatch-arg: expected a sequence of options, got one string")
        for arg in self.sbatch_args:
            V.check_sbatch_arg(arg)
        if self.signal_s is not None and not self.requeue:
            raise UserError("--signal makes a task requeue itself; it needs --requeue")
        return self

    def directives(self, gpus: int) -> list[str]:
        """The ``#SBATCH`` words of a task with ``gpus`` GPUs (the options validated first)."""
        self.validate()
        lines = [f"--cpus-per-task={self.cpus_per_run}"]
        if V.check_count("the GPUs of a task", gpus, 0):
            lines.append(f"--gres=gpu:{gpus}")
        for flag, value in (("partition", self.partition), ("account", self.account), ("qos", self.qos),
                            ("time", self.time), ("mem", self.mem)):
            if value:
                lines.append(f"--{flag}={value}")
        if self.requeue:
            lines.append("--requeue")
        if self.signal_s:
            lines.append(f"--signal=B:USR1@{self.signal_s}")
        return lines + [V.sbatch_word(arg) for arg in self.sbatch_args]


@dataclass
class Array:
    """One array (or, with ``single``, one plain job) of a submission."""

    stage: str
    command: str                       # "bench" or "tune"
    tasks: dict[int, str]              # index -> run or candidate key
    gpus: int = 0
    torchrun: int = 0                  # processes per task under torch.distributed.run (0: none)
    after: list[tuple[str, str]] = field(default_factory=list)   # (dependency type, stage of this submission)
    after_jobs: list[str] = field(default_factory=list)          # afterok on tasks of earlier submissions
    single: bool = False               # the selection job: no array, no key


# -- what is done, queued, running -----------------------------------------------------------------
def submissions(out) -> list[dict]:
    """Every array submitted for ``out`` (``OUT/slurm/submissions.jsonl``), oldest first."""
    path = Path(out) / "slurm" / "submissions.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def squeue_states(job_ids) -> dict[str, str] | None:
    """``{"JOB_TASK": state}`` of this user's queued and running tasks (None: no squeue here).

    The state is squeue's (``PENDING``, ``RUNNING``, ...), except :data:`STUCK` for a pending task
    whose reason is :data:`NEVER_REASON` (what it waits for ended without success)."""
    wanted = {str(j) for j in job_ids}
    if not wanted:
        return {}
    try:
        out = subprocess.run(["squeue", "-h", "-r", "-u", str(os.getuid()), "-o", "%F|%K|%T|%r"],
                             capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    states = {}
    for line in out.splitlines():
        job, _, rest = line.strip().partition("|")
        task, _, rest = rest.partition("|")
        state, _, reason = rest.partition("|")
        if job in wanted:
            stuck = state == "PENDING" and reason.strip() == NEVER_REASON
            states[f"{job}_{task if task not in ('N/A', '') else 0}"] = STUCK if stuck else state
    return states


def key_states(out, keys: list[str], table: str = "runs", recorded: dict | None = None) -> dict[str, tuple[str, str]]:
    """``{key: (state, detail)}``: done / failed from the result files, queued / running / stuck
    (pending on a dependency that failed) from ``squeue``, ``not submitted``, or ``failed`` for a
    task that ended without a result.

    ``recorded``: ``{key: (state, detail)}`` read from the bench's database
    (:func:`calibkit.bench.collect.recorded_states`): a run it holds as done is done (a local
    bench's runs, a result collected before its file was moved away), and one it holds otherwise
    takes that state where neither a result file nor the queue says anything.
    Paths in the details are under ``out`` as given (a copied folder names its own logs).
    """
    out, recorded = Path(out), recorded or {}
    subs = submissions(out)
    latest: dict[str, tuple[str | None, dict | None]] = {}  # key -> the last task submitted for it
    for sub in subs:
        for idx, key in sub.get("tasks", {}).items():
            latest[key] = (f"{sub['job_id']}_{idx}", sub)
    queue = squeue_states({s["job_id"] for s in subs if s.get("job_id")})
    states = {}
    for key in keys:
        path = R.result_path(out, key) if table == "runs" else R.candidate_path(out, key)
        doc = R.read_doc(path, table)
        status = doc["row"]["status"] if doc else None
        task, _ = latest.get(key, (None, None))
        live = (queue or {}).get(task) if task is not None else None
        if status == "done":
            states[key] = ("done", str(path.parent))
        elif recorded.get(key, ("",))[0] == "done":
            states[key] = recorded[key]
        elif live in RUNNING:
            states[key] = ("running", f"task {task}")
        elif live == STUCK:
            states[key] = ("stuck", f"task {task} is stuck: its dependency failed, it can never start (the same "
                                    "submission command cancels it and submits the run again)")
        elif live is not None:
            states[key] = ("queued", f"task {task} {live.lower()}")
        elif status == "failed" and doc is not None:  # a status is read from a document
            last = (doc["row"].get("error") or "").strip().splitlines()[-1:] or ["no error recorded"]
            states[key] = ("failed", f"{path}: {last[0]}")
        elif task is not None and queue is not None:
            states[key] = ("failed", f"task {task} ended without a result; see {out / 'slurm' / 'logs'}")
        elif key in recorded:
            states[key] = recorded[key]
        else:
            states[key] = ("not submitted", "")
    return states


def stuck_tasks(states: dict[str, tuple[str, str]]) -> list[str]:
    """The ``JOB_TASK`` of every ``stuck`` key among :func:`key_states`'s ``states``."""
    return [detail.split()[1] for state, detail in states.values() if state == "stuck"]


def cancel_stuck(states: dict[str, tuple[str, str]], dry_run: bool = False, log=print) -> list[str]:
    """Cancel (``scancel``) the tasks stuck on a dependency that failed, so that their runs can be
    submitted again; returns them. A dry run only says what it would cancel.

    Raises:
        RuntimeError: scancel failed (nothing was submitted).
    """
    tasks = stuck_tasks(states)
    if not tasks:
        return []
    words = ", ".join(tasks)
    if dry_run:
        log(f"dry run: would cancel {len(tasks)} task(s) stuck on a dependency that failed: {words}")
        return tasks
    proc = subprocess.run(["scancel", *tasks], capture_output=True, text=True)
    if proc.returncode != 0:
        raise UserRuntimeError(f"scancel {' '.join(tasks)} failed: {proc.stderr.strip() or proc.stdout.strip()}; "
                               "cancel them yourself, then run the same submission command again")
    log(f"cancelled {len(tasks)} task(s) stuck on a dependency that failed: {words}")
    return tasks


# -- writing and submitting ------------------------------------------------------------------------
def _next_number(slurm_dir: Path) -> int:
    used = [int(p.name[:3]) for p in slurm_dir.glob("[0-9][0-9][0-9]-*.sh")]
    return max(used, default=0) + 1


def _ranges(indices) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"`` (sbatch's --array syntax)."""
    idx, parts, i = sorted(indices), [], 0
    while i < len(idx):
        j = i
        while j + 1 < len(idx) and idx[j + 1] == idx[j] + 1:
            j += 1
        parts.append(str(idx[i]) if i == j else f"{idx[i]}-{idx[j]}")
        i = j + 1
    return ",".join(parts)


def _check_array(array: Array) -> None:
    """The fields of ``array`` that reach a script: a known stage and command, whole numbers."""
    if not _STAGE.fullmatch(str(array.stage)) or array.command not in ("bench", "tune"):
        raise ValueError(f"not a stage of a calibkit submission: {array.stage!r} ({array.command!r})")
    V.check_count("the GPUs of a task", array.gpus, 0)
    V.check_count("the processes of a task", array.torchrun, 0)
    for index in array.tasks:
        V.check_count("an array index", index, 0)


def script_text(array: Array, name: str, keys_path: Path | str, logs: Path | str, argv: list[str],
                opts: SlurmOptions) -> str:
    """The sbatch script of one array: look up the task's key, run calibkit, forward SIGUSR1.

    Every value is checked again here (:mod:`calibkit.bench.slurm_values`): the options, the
    paths (one line each), the calibkit arguments (one line each, no password). The ``#SBATCH``
    lines carry their values in sbatch's quoting (``%`` of a path doubled: sbatch reads ``%j``
    and the like in ``--output``); the command lines carry every word through :func:`shlex.quote`.
    The job name keeps only letters, digits and ``_ . + -`` (others become ``_``).
    """
    _check_array(array)
    keys_path = V.check_text("--out", keys_path)
    logs = V.check_text("--out", logs).replace("%", "%%")
    argv = V.check_argv(argv)
    name = re.sub(r"[^A-Za-z0-9_.+-]", "_", str(name))
    head = ["#!/bin/bash", f"# calibkit {array.command} --executor slurm: stage {array.stage}, "
            + ("the selection job" if array.single else f"{len(array.tasks)} task(s); index -> key: {keys_path}"),
            f"#SBATCH --job-name={name}"]
    if array.single:
        head.append(f"#SBATCH --output={V.sbatch_word(f'{logs}/%j-{array.stage}.out')}")
    else:
        par = f"%{opts.array_parallelism}" if opts.array_parallelism else ""
        head += [f"#SBATCH --array={_ranges(array.tasks)}{par}",
                 f"#SBATCH --output={V.sbatch_word(f'{logs}/%A_%a-{array.stage}.out')}"]
    head += ["#SBATCH --open-mode=append"] + [f"#SBATCH {d}" for d in opts.directives(array.gpus)]
    cmd = [V.check_word("the Python interpreter", sys.executable)]
    if array.torchrun > 1:
        cmd += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={array.torchrun}"]
    cmd += ["-m", "calibkit", *argv]
    run = " ".join(shlex.quote(c) for c in cmd)
    if array.single:
        body = ['key=""']
    else:
        body = [f"keys={shlex.quote(str(keys_path))}",
                "key=$(awk -v i=\"$SLURM_ARRAY_TASK_ID\" '$1 == i {print $2; exit}' \"$keys\")",
                "if [ -z \"$key\" ]; then echo \"calibkit: no key for array index $SLURM_ARRAY_TASK_ID in $keys\" >&2;"
                " exit 2; fi"]
        run += ' --run-key "$key"'
    # Under torch.distributed.run the workers are its children; they, not the launcher, take the signal.
    target = '$(ps -o pid= --ppid "$child")' if array.torchrun > 1 else '"$child"'
    body += ["echo \"calibkit: ${key:-selection} (job $SLURM_JOB_ID, restart ${SLURM_RESTART_COUNT:-0}) on "
             "$(hostname) at $(date -u +%FT%TZ), GPUs ${CUDA_VISIBLE_DEVICES:-none}\"",
             f"cd {shlex.quote(V.check_text('the working directory', os.getcwd()))}",
             f"{run} &", "child=$!",
             f"trap 'echo \"calibkit: SIGUSR1: stopping after this epoch\"; kill -USR1 {target} 2>/dev/null' USR1",
             'while :; do wait "$child"; rc=$?; kill -0 "$child" 2>/dev/null || break; done',
             "exit $rc"]
    return "\n".join(head + ["", *body, ""])


def submit(out, arrays: list[Array], argv: dict[str, list[str]], opts: SlurmOptions, dry_run: bool = False,
           log=print) -> dict[str, str]:
    """Write every array's script and key map under ``OUT/slurm/`` and submit them in order.

    Args:
        out: the bench directory.
        arrays: the arrays, each after the stages it depends on.
        argv: the calibkit arguments of each command (``"bench"``, ``"tune"``, ``"select"``),
            without ``--run-key``.
        opts: the resources and options.
        dry_run: write the scripts and print the sbatch commands, submit nothing.

    Returns:
        ``{stage: job id}`` (placeholders in a dry run).

    Raises:
        RuntimeError: sbatch failed (what was submitted before is recorded).
    """
    out = Path(V.check_text("--out", out)).resolve()
    sdir, logs = out / "slurm", out / "slurm" / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    number = _next_number(sdir)
    ids: dict[str, str] = {}  # stage -> its job id
    lines: list[str] = []
    for array in arrays:
        base = f"{number:03d}-{array.stage}"
        keys_path = sdir / f"{base}.keys"
        if not array.single:
            keys_path.write_text("".join(f"{i} {V.check_key(k)}\n" for i, k in sorted(array.tasks.items())))
        script = sdir / f"{base}.sh"
        name = f"calibkit-{out.name}-{array.stage}"
        command = "select" if array.single else array.command
        script.write_text(script_text(array, name, keys_path, logs, argv[command], opts))
        script.chmod(0o755)
        deps = [f"{kind}:{ids[stage]}" for kind, stage in array.after if stage in ids]
        deps += [f"afterok:{job}" for job in array.after_jobs]
        for dep in deps:  # written unquoted (a dry run's $ce must expand): only these forms
            kind, _, job = dep.partition(":")
            if kind not in ("afterok", "aftercorr", "afterany") or not _JOB.fullmatch(job):
                raise UserError(f"not a job dependency: {dep!r}")
        # cancelled by SLURM as soon as what it waits for ends without success (never left pending)
        waits = [f"--dependency={','.join(deps)}", "--kill-on-invalid-dep=yes"] if deps else []
        sbatch = ["sbatch", "--parsable", *waits, str(script)]
        var = array.stage.replace("-", "_")
        lines.append(f"{var}=$({' '.join(shlex.quote(a) if not a.startswith('--dependency') else a for a in sbatch)})")
        if dry_run:
            ids[array.stage] = f"${var}"
            continue
        proc = subprocess.run(sbatch, capture_output=True, text=True)
        if proc.returncode != 0:
            raise UserRuntimeError(f"sbatch {script} failed: {proc.stderr.strip() or proc.stdout.strip()}")
        job = proc.stdout.strip().split(";")[0]
        if not re.fullmatch(r"\d+", job):
            raise UserRuntimeError(f"sbatch {script}: expected a job id, got {job!r}")
        ids[array.stage] = job
        with open(sdir / "submissions.jsonl", "a") as f:
            f.write(json.dumps({"number": number, "stage": array.stage, "job_id": job, "script": str(script),
                                "tasks": {str(i): k for i, k in array.tasks.items()}}) + "\n")
        log(f"submitted {array.stage}: job {job} ({'1 job' if array.single else f'{len(array.tasks)} task(s)'}"
            + (f", after {','.join(deps)}" if deps else "") + f"); script {script}")
    (sdir / f"{number:03d}-submit.sh").write_text("#!/bin/sh\nset -e\n" + "".join(line + "\n" for line in lines))
    if dry_run:
        log(f"dry run: {len(arrays)} script(s) written to {sdir}; submit them with:")
        for line in lines:
            log(f"  {line}")
    return ids
