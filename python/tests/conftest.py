"""Fixtures of the polykv package tests: a REAL polykvd (from the build folder) on a private
ipc:// endpoint, the REAL SmolLM2-135M-Instruct model, and one pool of a WikiText-2 article
framed with the model's own chat template. No mocks.

Environment: POLYKV_BUILD_DIR (the CMake build folder holding daemon/polykvd and
cli/polykv-cli; python/tests/run_ctest.sh sets it) and POLYKV_SMOLLM2_GGUF (the model file,
scripts/fetch-model.sh). A missing one fails the tests (it never skips them)."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import tempfile
import time

import pytest

import polykv

ROOT = pathlib.Path(__file__).resolve().parents[2]
ARTICLE = ROOT / "data" / "wikitext-2" / "robert_boulter.txt"
INSTRUCTION = "You answer questions about this article."


def _required_env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"{name} is not set (python/tests/run_ctest.sh sets it)", pytrace=False)
    return value


@pytest.fixture(scope="session")
def build_dir() -> pathlib.Path:
    return pathlib.Path(_required_env("POLYKV_BUILD_DIR"))


@pytest.fixture(scope="session")
def model_path() -> str:
    path = _required_env("POLYKV_SMOLLM2_GGUF")
    if not os.path.isfile(path):
        pytest.fail(f"POLYKV_SMOLLM2_GGUF={path} does not exist", pytrace=False)
    return path


@pytest.fixture(scope="session")
def cli(build_dir) -> str:
    path = build_dir / "cli" / "polykv-cli"
    if not os.access(path, os.X_OK):
        pytest.fail(f"{path} not built (cmake --build {build_dir} --target polykv-cli)")
    return str(path)


@pytest.fixture(scope="session")
def endpoint(build_dir, cli):
    """polykvd (host backend) on a private socket; stopped with SIGTERM at the end, and the
    socket must be gone afterwards."""
    daemon = build_dir / "daemon" / "polykvd"
    if not os.access(daemon, os.X_OK):
        pytest.fail(f"{daemon} not built (cmake --build {build_dir} --target polykvd)")
    work = tempfile.mkdtemp(prefix="polykv-pytest-")
    sock = os.path.join(work, "control.sock")
    ep = f"ipc://{sock}"
    log = open(os.path.join(work, "polykvd.log"), "w")
    proc = subprocess.Popen(
        [str(daemon), "--endpoint", ep, "--backend", "host", "--log-level", "info"],
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                pytest.fail(f"polykvd exited with {proc.returncode}: "
                            + open(log.name).read()[-2000:])
            try:
                polykv.Client(ep, timeout_ms=500).ping()
                break
            except polykv.Error:
                if time.monotonic() > deadline:
                    pytest.fail("polykvd did not answer within 30 s")
                time.sleep(0.2)
        yield ep
    finally:
        proc.terminate()
        try:
            rc = proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        log.close()
        leftover = os.path.exists(sock)
        shutil.rmtree(work, ignore_errors=True)
        assert rc == 0, f"polykvd exited with status {rc}"
        assert not leftover, f"polykvd left its socket {sock} behind"


@pytest.fixture(scope="session")
def client(endpoint) -> polykv.Client:
    return polykv.Client(endpoint)


@pytest.fixture(scope="session")
def pool(client, model_path) -> polykv.PoolInfo:
    """The article as a system turn of SmolLM2's own template, compressed with the daemon's
    default codec (the examples create the same pool: content-addressed, it is reused)."""
    return client.create_pool(model_path, file=ARTICLE, chat_system=INSTRUCTION)


@pytest.fixture(scope="session")
def agent(client, pool, model_path) -> polykv.Agent:
    return polykv.Agent(client, pool=pool.id, model=model_path)
