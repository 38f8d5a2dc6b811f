"""The wheel ships only the provider: no test servers, writers, benchmarks or demo."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_wheel_holds_only_the_provider_package(tmp_path: Path) -> None:
    # build from a copy: a build without isolation leaves build/ and egg-info next to the sources
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(".venv", ".git", "build", "*.egg-info", "__pycache__"))
    out = tmp_path / "wheel"
    build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out)]
    subprocess.run(
        [*build, str(src)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = out.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    modules = [n for n in names if n.endswith(".py")]
    assert modules, names
    assert all(n.startswith("airflow_provider_mysqlcdc/") for n in modules), [
        n for n in modules if not n.startswith("airflow_provider_mysqlcdc/")
    ]
    product = {"airflow_provider_mysqlcdc/verify.py", "airflow_provider_mysqlcdc/operators/verify.py"}  # verify's
    shipped = {Path(n).stem for n in modules if n not in product}  # same stem as tests/support/verify.py
    assert product <= set(modules), "the verify modules are missing from the wheel"
    for scaffolding in ("mariadb", "random_writer", "verify", "soak", "bench_data", "demo", "run", "conftest"):
        assert scaffolding not in shipped, f"{scaffolding}.py ships in the wheel"
    assert not [n for n in modules if "/testing/" in n or "/tests/" in n]
