"""The secret scan finds a planted secret in a file, an argv and a Spark environment document."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.secret_scan import (
    mask,
    process_argvs,
    scan_argvs,
    scan_directory,
    scan_document,
    scan_processes,
)

SECRET = "s3secret-Zq8f3Lr0pX2vN7yT1bKc"
OTHER = "another-secret-value-42"


def test_file_under_a_directory(tmp_path: Path) -> None:
    (tmp_path / "logs" / "task").mkdir(parents=True)
    (tmp_path / "logs" / "clean.log").write_text("nothing here\n")
    leaky = tmp_path / "logs" / "task" / "attempt=1.log"
    leaky.write_text("line one\nconnecting with password=" + SECRET + "\nline three\n")
    (tmp_path / "event.bin").write_bytes(b"\x00\xff" + SECRET.encode() + b"\x00")

    found = scan_directory([SECRET, OTHER], tmp_path)

    assert [f.where for f in found] == [f"{tmp_path / 'event.bin'}:1", f"{leaky}:2"]
    assert {f.secret for f in found} == {mask(SECRET)}
    assert SECRET not in str(found[0]), "a finding must not repeat the secret"


def test_clean_directory_is_empty(tmp_path: Path) -> None:
    (tmp_path / "a.log").write_text("s3secret-but-not-the-one\n")
    assert scan_directory([SECRET], tmp_path) == []


def test_fake_argv_source() -> None:
    argvs = {
        101: ["/usr/bin/java", "-cp", "x", "org.apache.spark.deploy.SparkSubmit", "--conf", f"spark.pw={SECRET}"],
        202: ["python", "-m", "moto.server"],
        303: [],
    }
    found = scan_argvs([SECRET, OTHER], argvs)
    assert [(f.where, f.secret) for f in found] == [("pid 101 (java) argv[5]", mask(SECRET))]
    assert scan_argvs([SECRET], {202: argvs[202]}) == []


def test_spark_environment_document() -> None:
    env = {
        "runtime": {"javaVersion": "17"},
        "sparkProperties": [["spark.app.name", "x"], ["spark.executorEnv.AWS_SECRET_ACCESS_KEY", SECRET]],
        "systemProperties": [["sun.java.command", f"SparkSubmit --conf k={OTHER}"]],
        "classpathEntries": [],
    }
    found = scan_document([SECRET, OTHER], env, "app-1/environment")
    assert [f.where for f in found] == [
        "app-1/environment['sparkProperties'][1]['spark.executorEnv.AWS_SECRET_ACCESS_KEY']",
        "app-1/environment['systemProperties'][0]['sun.java.command']",
    ]
    assert scan_document([SECRET], {"sparkProperties": [["a", "b"]]}) == []


def test_this_process_argv_is_visible_to_the_scan() -> None:
    import os

    argvs = process_argvs()
    assert os.getpid() in argvs and argvs[os.getpid()]
    assert scan_processes(["no-such-secret-" + "x" * 20]) == []


def test_short_secret_is_refused() -> None:
    with pytest.raises(ValueError, match="shorter than 8"):
        scan_argvs(["abc"], {1: ["abc"]})
