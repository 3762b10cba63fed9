"""Create the clean environment `make test` installs the wheel into.

    python tests/make_test_env.py ENV_DIR TORCH_SPEC [--index]

No Triton and no source checkout on its path.  If the Python running this
already has torch, click and pytest (the build environment, or the GPU machines'
python3, which have no network), the environment links that Python's packages
except Triton; otherwise, or with
--index (make test-torch: a given torch release), it installs TORCH_SPEC,
click and pytest from the package index.
"""
import importlib.util
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

HIDDEN_PREFIXES = ("triton", "gg_runtime", "__pycache__")
# What the wheel needs at run time (torch first, installed as TORCH_SPEC) and pytest.
RUNTIME_AND_TEST_PACKAGES = ("torch", "click", "pytest")


def env_site_packages(env: Path) -> Path:
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    return env / "lib" / version / "site-packages"


def link_base_packages(env: Path) -> None:
    linked = env / "linked"
    linked.mkdir()
    for base in site.getsitepackages() + [sysconfig.get_paths()["purelib"]]:
        if not os.path.isdir(base):
            continue
        for entry in sorted(os.listdir(base)):
            if entry.startswith(HIDDEN_PREFIXES) or (linked / entry).exists():
                continue
            (linked / entry).symlink_to(Path(base) / entry)
    # addsitedir also runs the .pth files of the linked packages.
    pth = f"import site; site.addsitedir({str(linked)!r})\n"
    (env_site_packages(env) / "linked.pth").write_text(pth)


def main(env_dir: str, torch_spec: str, from_index: bool) -> None:
    env = Path(env_dir).resolve()
    done = env / "complete"  # written last: a half-made environment is made again
    if done.exists():
        return
    shutil.rmtree(env, ignore_errors=True)
    if not from_index and all(importlib.util.find_spec(name) for name in RUNTIME_AND_TEST_PACKAGES):
        print(f"creating {env}: {sys.executable}'s packages without Triton")
        venv.create(env, with_pip=False)
        link_base_packages(env)
    else:
        print(f"creating {env}: {torch_spec}, click and pytest from the package index")
        venv.create(env, with_pip=True)
        subprocess.run([env / "bin" / "python", "-m", "pip", "install", "-q", torch_spec,
                        *RUNTIME_AND_TEST_PACKAGES[1:]], check=True)
    done.write_text("")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], "--index" in sys.argv[3:])
