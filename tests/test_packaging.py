"""Packaging: a wheel built from the repository carries the prompts and templates; `--version`."""

import importlib.metadata
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

import mkevolve
from mkevolve.cli import main

ROOT = Path(__file__).resolve().parents[1]
# Not copied into the build: VCS data, earlier build outputs (setuptools would ship a stale build/lib),
# run outputs and caches.
SKIP_TOP = {".git", "build", "dist", "outputs", ".venv", ".pytest_cache", ".benchmarks"}


def _files(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path]:
    """(source copy, wheel): the wheel is built from a copy of the tree, so the repository is left as it is."""
    pytest.importorskip("setuptools", minversion="68")  # the build backend, used without build isolation
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"

    def ignore(folder, names):
        top = Path(folder) == ROOT
        return {n for n in names if n == "__pycache__" or n.endswith(".egg-info") or (top and n in SKIP_TOP)}

    shutil.copytree(ROOT, src, ignore=ignore)
    # --no-build-isolation: no network; setuptools is the one already installed.
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                    "-w", str(tmp / "dist"), str(src)], check=True, cwd=tmp, timeout=300)
    (wheel,) = (tmp / "dist").glob("mkevolve-*.whl")
    return src, wheel


def test_the_wheel_carries_every_prompt_template_and_module(built):
    src, wheel = built
    names = set(zipfile.ZipFile(wheel).namelist())
    prompts, templates = _files(src / "prompts"), _files(src / "mkevolve" / "templates")
    assert prompts and templates
    missing = [f"prompts/{f}" for f in prompts if f"mkevolve/prompt_templates/{f}" not in names]
    missing += [f"mkevolve/templates/{f}" for f in templates if f"mkevolve/templates/{f}" not in names]
    # pyproject.toml lists the packages by hand: a subpackage missing there is missing here.
    missing += [f"mkevolve/{f}" for f in _files(src / "mkevolve") if f.endswith(".py")
                and f"mkevolve/{f}" not in names]
    assert not missing, f"not in {wheel.name}: {missing}"
    assert not [n for n in names if n.startswith("prompts/")]  # inside the package, not top level


def test_prompts_render_from_the_unpacked_wheel(built, tmp_path):
    _, wheel = built
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = ("import mkevolve, mkevolve.prompts as p; print(mkevolve.__file__); print(p.PROMPTS_DIR); "
            "print(p.render('generate.j2', subproblem='s', shapes=[], device='cpu', on_gpu=False, "
            "problem_source='class Model: pass'))")
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, check=True,
                         capture_output=True, text=True, timeout=120).stdout.splitlines()
    assert Path(out[0]).is_relative_to(site)  # the wheel's copy, not the repository's
    assert Path(out[1]) == site / "mkevolve" / "prompt_templates"
    assert "class Model: pass" in "\n".join(out[2:])


def _expected_version() -> str:
    try:
        return importlib.metadata.version("mkevolve")
    except importlib.metadata.PackageNotFoundError:
        return mkevolve.__version__


def test_version_flag_prints_the_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"mkevolve {_expected_version()}\n"


def test_version_falls_back_without_package_metadata(capsys, monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"mkevolve {mkevolve.__version__}\n"
    # The fallback is only as good as its agreement with the packaged version.
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["version"] == mkevolve.__version__
