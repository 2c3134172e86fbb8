"""The gpuheap wheel (README "Install"): `scripts/wheel.sh`, i.e.
    python3 -m build --no-isolation --wheel --outdir .whl python

Drives the CMake build of the repository (BUILD_DIR, default build/: configured like
scripts/setup.sh when it is not yet, then only the CLI, the preload and the simulated runtime
are built), installs it into a staging prefix (`cmake --install`) and lays that out inside
the package, debug info stripped:

    gpuheap/bin/gpuheap                       the CLI (RUNPATH $ORIGIN/../lib)
    gpuheap/lib/*.so.*                        what the CLI links beyond glibc and libstdc++
    gpuheap/lib/gpuheap/libgpuheap.so         the preload (RUNPATH $ORIGIN), with libunwind
                                              and its liblzma renamed *-gpuheap.so.*
    gpuheap/lib/gpuheap/simcuda/              the simulated CUDA runtime (`run --simulate`)

The libraries are bundled as shared objects, not linked statically: Debian has no static
libfmt or libspdlog, and elfutils' libdw/libelf are LGPL (a user can replace a bundled .so).
The preload's own dependencies get unique sonames, as auditwheel does, because they are
loaded into the traced job: a job that uses its own libunwind.so.8 or liblzma.so.5 keeps its
own. The platform tag is manylinux_2_<N>_x86_64 with N the newest GLIBC_2.N symbol version any
bundled file needs (the glibc floor); the CUDA libraries are never bundled.
"""

import os
import re
import shutil
import subprocess
import sys

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py
from wheel.bdist_wheel import bdist_wheel

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# The manylinux policy's libraries (PEP 600/599) that a wheel may take from the system; the
# loader itself and the CUDA libraries the job brings are never bundled either.
SYSTEM_LIBS = {"libc.so.6", "libm.so.6", "libdl.so.2", "librt.so.1", "libpthread.so.0", "libgcc_s.so.1",
               "libstdc++.so.6", "ld-linux-x86-64.so.2", "libnsl.so.1", "libutil.so.1", "libresolv.so.2"}
_platform = {}
BUILD_DIR = os.path.abspath(os.environ.get("BUILD_DIR", os.path.join(ROOT, "build")))


def _project_version():
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        m = re.search(r"project\(gpuheap VERSION ([0-9.]+)", f.read())
    return m.group(1)


def _sh(*cmd, **kw):
    print("wheel: " + " ".join(cmd), flush=True)
    return subprocess.run(cmd, check=True, **kw)


def _out(*cmd):
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def _cmake_build(build_dir):
    if not os.path.isfile(os.path.join(build_dir, "CMakeCache.txt")):
        cuda = os.environ.get("CUDA_ROOT", "/usr/local/cuda")
        _sh("cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=RelWithDebInfo", f"-DCUDA_ROOT={cuda}")
    jobs = os.environ.get("JOBS", str(os.cpu_count() or 1))
    _sh("cmake", "--build", build_dir, "-j", jobs, "--target", "gpuheap_cli", "gpuheap", "simcuda")


def _needed(path):
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", _out("readelf", "-d", path))


def _resolved(path):
    """{soname: file} of what the build machine's loader finds for `path`'s libraries."""
    found = {}
    for line in _out("ldd", path).splitlines():
        m = re.match(r"\s*(\S+) => (/\S+)", line)
        if m:
            found[m.group(1)] = os.path.realpath(m.group(2))
    return found


def _bundle(elf, dest, rename, done):
    """Copies the libraries `elf` needs beyond SYSTEM_LIBS into `dest` (recursively), each with
    RUNPATH $ORIGIN; with `rename`, under a soname of their own (NAME-gpuheap.so.N)."""
    where = _resolved(elf)
    for soname in _needed(elf):
        if soname in SYSTEM_LIBS:
            continue
        new = re.sub(r"\.so", "-gpuheap.so", soname, count=1) if rename else soname
        target = os.path.join(dest, new)
        if not os.path.exists(target):
            src = os.path.join(os.path.dirname(elf), soname) if os.path.exists(
                os.path.join(os.path.dirname(elf), soname)) else where.get(soname)
            if not src:
                raise RuntimeError(f"wheel: {elf} needs {soname}, which the loader does not find")
            shutil.copyfile(src, target)
            os.chmod(target, 0o755)
            if rename:
                _sh("patchelf", "--set-soname", new, target)
            _sh("patchelf", "--set-rpath", "$ORIGIN", target)
            done.append(target)
            _bundle(target, dest, rename, done)
        if new != soname:
            _sh("patchelf", "--replace-needed", soname, new, elf)


# The manylinux policies (PEP 600) as auditwheel defines them for x86_64: the glibc of each
# and the newest libstdc++ (GLIBCXX, CXXABI) and libgcc_s (GCC) symbol versions its reference
# distribution ships. A wheel is manylinux_2_N for the smallest N whose policy covers every
# versioned symbol it needs: glibc alone is not enough, Debian 12's libstdc++ (GCC 12) is newer
# than glibc 2.34's reference (AlmaLinux 9, GCC 11) allows.
POLICIES = [(17, (3, 4, 19), (1, 3, 7), (4, 8, 0)), (24, (3, 4, 22), (1, 3, 10), (4, 8, 0)),
            (28, (3, 4, 24), (1, 3, 11), (7, 0, 0)), (31, (3, 4, 28), (1, 3, 12), (7, 0, 0)),
            (34, (3, 4, 29), (1, 3, 13), (7, 0, 0)), (35, (3, 4, 30), (1, 3, 13), (12, 0, 0)),
            (39, (3, 4, 33), (1, 3, 15), (14, 0, 0))]


def _needed_versions(path):
    """{"GLIBC": (2, 34), "GLIBCXX": (3, 4, 30), ...}: the newest version of each library
    `path` needs (readelf -V: the version-needs section)."""
    newest = {}
    for lib, ver in re.findall(r"Name: (GLIBC|GLIBCXX|CXXABI|GCC)_([0-9.]+)", _out("readelf", "-V", "-W", path)):
        v = tuple(int(x) for x in ver.split("."))
        newest[lib] = max(newest.get(lib, v), v)
    return newest


def _platform_tag(files):
    """(manylinux tag, {file: its glibc 2.N}): the smallest policy covering every file."""
    need, per = {}, {}
    for f in files:
        for lib, v in _needed_versions(f).items():
            need[lib] = max(need.get(lib, v), v)
        per[os.path.basename(f)] = _needed_versions(f).get("GLIBC", (2, 0))[1]
    glibc = need.get("GLIBC", (2, 0))[1]
    for n, glibcxx, cxxabi, gcc in POLICIES:
        if (n >= glibc and need.get("GLIBCXX", ()) <= glibcxx and need.get("CXXABI", ()) <= cxxabi
                and need.get("GCC", ()) <= gcc):
            return f"manylinux_2_{n}_x86_64", per, need
    raise RuntimeError(f"wheel: no manylinux policy covers {need}")


def _lay_out(stage, build_dir, pkg):
    """The installed files of `stage` (cmake --install) plus the simulated runtime, in `pkg`."""
    for sub in ("bin", "lib"):
        shutil.rmtree(os.path.join(pkg, sub), ignore_errors=True)
    os.makedirs(os.path.join(pkg, "bin"))
    shutil.copytree(os.path.join(stage, "lib", "gpuheap"), os.path.join(pkg, "lib", "gpuheap"), symlinks=False)
    shutil.copy2(os.path.join(stage, "bin", "gpuheap"), os.path.join(pkg, "bin", "gpuheap"))
    sim = os.path.join(pkg, "lib", "gpuheap", "simcuda")
    os.makedirs(sim)
    for name in ("libcudart.so.13", "libcuda.so.1"):
        shutil.copy2(os.path.join(build_dir, "simcuda", name), os.path.join(sim, name))
    cli, preload = os.path.join(pkg, "bin", "gpuheap"), os.path.join(pkg, "lib", "gpuheap", "libgpuheap.so")
    # The preload's libunwind was installed beside it under its own name: bundle from there.
    done = []
    _bundle(preload, os.path.dirname(preload), True, done)
    for f in os.listdir(os.path.dirname(preload)):  # libunwind.so.8 under its old name
        path = os.path.join(os.path.dirname(preload), f)
        if os.path.isfile(path) and "-gpuheap.so" not in f and f != "libgpuheap.so":
            os.unlink(path)
    _bundle(cli, os.path.join(pkg, "lib"), False, done)
    _sh("patchelf", "--set-rpath", "$ORIGIN/../lib", cli)
    files = [cli, preload] + done + [os.path.join(sim, n) for n in os.listdir(sim)]
    _sh("strip", "--strip-debug", *files)
    return files


def _build_native(pkg):
    build_dir = BUILD_DIR
    _cmake_build(build_dir)
    stage = os.path.join(build_dir, "wheel-stage")
    shutil.rmtree(stage, ignore_errors=True)
    _sh("cmake", "--install", build_dir, "--prefix", stage, stdout=subprocess.DEVNULL)
    files = _lay_out(stage, build_dir, pkg)
    for f in files:  # everything resolves inside the wheel or to SYSTEM_LIBS
        missing = [s for s in _needed(f) if s not in SYSTEM_LIBS and not s.startswith("libcuda")
                   and not os.path.exists(os.path.join(os.path.dirname(f), s))
                   and not os.path.exists(os.path.join(pkg, "lib", s))]
        if missing:
            raise RuntimeError(f"wheel: {f} needs {missing}, which are not bundled")
    _platform["tag"], per, need = _platform_tag(files)
    print(f"wheel: platform {_platform['tag']}; needs " + ", ".join(
        f"{lib}_{'.'.join(map(str, v))}" for lib, v in sorted(need.items())) + " (glibc: " +
        ", ".join(f"{k} 2.{v}" for k, v in sorted(per.items())) + ")")
    commit = _out("git", "-C", ROOT, "rev-parse", "--short", "HEAD").strip() if shutil.which("git") else ""
    if commit and subprocess.run(["git", "-C", ROOT, "diff", "--quiet", "HEAD"]).returncode != 0:
        commit += "-dirty"
    with open(os.path.join(pkg, "_build.py"), "w") as f:
        f.write(f"__version__ = {_project_version()!r}\ncommit = {commit or 'unknown'!r}\n")


class BuildPy(build_py):
    def run(self):
        super().run()
        _build_native(os.path.join(os.path.abspath(self.build_lib), "gpuheap"))


class BinaryDistribution(Distribution):
    """Binaries inside: a platlib wheel (root not pure), installed into site-packages itself
    rather than under .data/purelib."""

    def has_ext_modules(self):
        return True


class BdistWheel(bdist_wheel):
    def get_tag(self):
        # Not Python-specific (the binaries do not link libpython): py3-none-<platform>.
        return "py3", "none", _platform["tag"]


if sys.platform != "linux":
    raise SystemExit("gpuheap: the wheel is built on Linux x86-64 only")
# setuptools' own files go into the build tree too, never beside the sources.
os.makedirs(os.path.join(BUILD_DIR, "wheel-setuptools"), exist_ok=True)
setup(
    distclass=BinaryDistribution,
    version=_project_version(),
    cmdclass={"build_py": BuildPy, "bdist_wheel": BdistWheel},
    options={"build": {"build_base": os.path.join(BUILD_DIR, "wheel-setuptools")},
             "egg_info": {"egg_base": os.path.join(BUILD_DIR, "wheel-setuptools")}},
)
