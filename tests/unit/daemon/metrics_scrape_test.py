#!/usr/bin/env python3
"""polykvd --metrics-listen, scraped with a real client (curl) and parsed with the
prometheus_client text parser: values agree with `polykv-cli pools list --json` and the
pool file on disk, counters move by exact amounts (creates, prefill tokens, attaches,
errors by code), leases and agents per pool are counted while an agent holds the pool, and
after a restart with --state-dir --preload the pool is restored (no prefill tokens).

usage: metrics_scrape_test.py POLYKVD POLYKV_CLI MODEL_DIR
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from prometheus_client.parser import text_string_to_metric_families

POLYKVD, CLI, MODEL = sys.argv[1:4]
TMP = tempfile.mkdtemp(prefix="polykv-metrics-")
ENDPOINT = f"ipc://{TMP}/control.sock"
PREFIX = f"/polykv-mt{os.getpid()}-"
STATE = f"{TMP}/state"
IDS = ",".join(str(i) for i in [1] + [(i * 37 + 5) % 500 + 3 for i in range(1, 40)])
failures = []
checked = [0]


def check(cond, what):
    checked[0] += 1
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr)


def start_daemon(log, extra=()):
    offset = os.path.getsize(log) if os.path.exists(log) else 0  # this start's lines only
    err = open(log, "ab")
    p = subprocess.Popen([POLYKVD, "--endpoint", ENDPOINT, "--backend", "host", "--shm-prefix",
                          PREFIX, "--threads", "1", "--log-level", "info", "--state-dir", STATE,
                          "--metrics-listen", "127.0.0.1:0", *extra],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.time() + 60
    port = None
    while time.time() < deadline and p.poll() is None:
        with open(log) as f:
            f.seek(offset)
            text = f.read()
        ports = re.findall(r"metrics: serving http://127\.0\.0\.1:(\d+)/metrics", text)
        if ports and "serving ipc://" in text.split("metrics: serving")[-1]:
            port = int(ports[-1])
            break
        time.sleep(0.05)
    if port is None:
        raise RuntimeError("polykvd did not start:\n" + open(log).read())
    return p, port


def cli(*args):
    r = subprocess.run([CLI, *args, "--endpoint", ENDPOINT], capture_output=True, text=True,
                       timeout=120)
    return r


def scrape(port):
    out = subprocess.run(["curl", "-sS", "--fail", f"http://127.0.0.1:{port}/metrics"],
                         capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise RuntimeError("curl failed: " + out.stderr)
    samples = {}
    for fam in text_string_to_metric_families(out.stdout):
        for s in fam.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def main():
    log = f"{TMP}/polykvd.log"
    daemon, port = start_daemon(log)
    agent = None
    try:
        m0 = scrape(port)
        check(value(m0, "polykv_pools", backend="host") == 0, "no pools at start")
        check(value(m0, "polykv_persisted_pools") == 0, "no pool files at start")

        r = cli("pools", "create", "--model", MODEL, "--token-ids", IDS, "--codec", "k8v3",
                "--json")
        check(r.returncode == 0, "create: " + r.stderr)
        pool = json.loads(r.stdout)["id"]
        m1 = scrape(port)
        lst = json.loads(cli("pools", "list", "--json").stdout)["pools"]
        check(len(lst) == 1 and lst[0]["id"] == pool, "pools list shows the pool")
        p = lst[0]
        check(value(m1, "polykv_pools", backend="host") == 1, "polykv_pools = 1")
        for part in ("key_codes", "key_scales", "value_codes", "value_norms", "overhead"):
            check(value(m1, "polykv_pool_bytes", pool=pool, part=part) == p["bytes"][part],
                  f"bytes {part} = {p['bytes'][part]}")
        parts = sum(value(m1, "polykv_pool_bytes", pool=pool, part=x)
                    for x in ("key_codes", "key_scales", "value_codes", "value_norms", "overhead"))
        check(parts == p["total_bytes"], "parts add up to total_bytes")
        lab = dict(pool=pool, codec="k8v3")
        check(value(m1, "polykv_pool_total_bytes", **lab) == p["total_bytes"], "total bytes")
        check(value(m1, "polykv_pool_bf16_bytes", **lab) == p["bf16_bytes"], "bf16 bytes")
        check(abs(value(m1, "polykv_pool_effective_ratio", **lab) - p["effective_ratio"]) < 1e-12,
              "effective ratio")
        check(value(m1, "polykv_pool_tokens", **lab) == 40, "tokens = 40")
        check(value(m1, "polykv_memory_used_bytes", backend="host") == p["total_bytes"],
              "memory used = the pool")
        check(value(m1, "polykv_prefill_tokens_total") -
              value(m0, "polykv_prefill_tokens_total") == 40, "prefill tokens +40")
        check(value(m1, "polykv_create_duration_seconds_count") -
              value(m0, "polykv_create_duration_seconds_count") == 1, "one create observed")
        check(value(m1, "polykv_requests_total", type="CREATE_POOL") == 1, "CREATE_POOL = 1")
        file = f"{STATE}/pools/{pool}.pkv"
        check(os.path.exists(file), "the pool file exists")
        check(value(m1, "polykv_persisted_pools") == 1, "one pool file")
        check(value(m1, "polykv_persisted_bytes") == os.path.getsize(file),
              "persisted bytes = the file's size")

        # An error by code: evicting an unknown pool is NOT_FOUND.
        r = cli("pools", "evict", "ab" * 32)
        check(r.returncode != 0, "evict of an unknown pool fails")
        m2 = scrape(port)
        check(value(m2, "polykv_errors_total", code="NOT_FOUND") -
              value(m1, "polykv_errors_total", code="NOT_FOUND") == 1, "NOT_FOUND +1")
        check(value(m2, "polykv_requests_total", type="EVICT") -
              value(m1, "polykv_requests_total", type="EVICT") == 1, "EVICT +1")

        # An agent holding the pool: one lease, one agent, one more attach observed.
        hold = f"{TMP}/hold"
        open(hold, "w").close()
        agent_err = f"{TMP}/agent.err"
        agent = subprocess.Popen([CLI, "agent", "--pool", pool, "--model", MODEL, "--endpoint",
                                  ENDPOINT, "--prompt-ids", "1,5,9", "--max-new-tokens", "4",
                                  "--json", "--threads", "1", "--hold-while-exists", hold],
                                 stdout=subprocess.DEVNULL, stderr=open(agent_err, "wb"))
        deadline = time.time() + 120
        while time.time() < deadline and "holding the pool" not in open(agent_err).read():
            check(agent.poll() is None, "agent runs: " + open(agent_err).read())
            if agent.poll() is not None:
                break
            time.sleep(0.05)
        m3 = scrape(port)
        check(value(m3, "polykv_pool_leases", **lab) == 1, "one lease")
        check(value(m3, "polykv_pool_agents", **lab) == 1, "one agent")
        check(value(m3, "polykv_attach_duration_seconds_count") -
              value(m2, "polykv_attach_duration_seconds_count") == 1, "one attach observed")
        check(value(m3, "polykv_attach_duration_seconds_bucket", le="+Inf") ==
              value(m3, "polykv_attach_duration_seconds_count"), "+Inf bucket = count")
        os.unlink(hold)
        check(agent.wait(timeout=60) == 0, "agent exits 0")
        agent = None

        # Restart on the same state folder with --preload: restored, nothing prefilled.
        daemon.send_signal(signal.SIGTERM)
        check(daemon.wait(timeout=30) == 0, "polykvd exits 0 on SIGTERM")
        daemon, port = start_daemon(log, ["--preload"])
        m4 = scrape(port)
        check(value(m4, "polykv_pools", backend="host") == 1, "restored: one pool")
        check(value(m4, "polykv_pools_restored_total") == 1, "restored_total = 1")
        check(value(m4, "polykv_prefill_tokens_total") == 0, "no prefill after a restart")
        lst = json.loads(cli("pools", "list", "--json").stdout)["pools"]
        check(len(lst) == 1 and lst[0]["id"] == pool, "pools list after restart")
        check(value(m4, "polykv_pool_total_bytes", **lab) == p["total_bytes"], "same size")
        # The create of the same document now answers from memory.
        r = cli("pools", "create", "--model", MODEL, "--token-ids", IDS, "--codec", "k8v3",
                "--json")
        check(r.returncode == 0 and json.loads(r.stdout)["id"] == pool, "same id")
        m5 = scrape(port)
        check(value(m5, "polykv_prefill_tokens_total") == 0, "still no prefill")
        # Export by hand (as another host would receive it).
        exported = f"{TMP}/exported.pkv"
        r = cli("pools", "export", pool[:12], exported)
        check(r.returncode == 0, "export: " + r.stderr)
        with open(file, "rb") as a, open(exported, "rb") as b:
            region = p["total_bytes"]
            check(a.read()[-region:] == b.read()[-region:], "exported region = persisted region")
        # Evict removes the file.
        check(cli("pools", "evict", pool).returncode == 0, "evict")
        m6 = scrape(port)
        check(not os.path.exists(file), "evict removed the file")
        check(value(m6, "polykv_persisted_pools") == 0, "no pool files after evict")
        check(value(m6, "polykv_pools", backend="host") == 0, "no pools after evict")
        # Import into the running daemon's state folder: the next create restores it.
        r = cli("pools", "import", exported, "--state-dir", STATE)
        check(r.returncode == 0, "import: " + r.stderr)
        check(os.path.exists(file), "import placed the file")
        r = cli("pools", "create", "--model", MODEL, "--token-ids", IDS, "--codec", "k8v3",
                "--json")
        check(r.returncode == 0 and json.loads(r.stdout)["id"] == pool, "create after import")
        m7 = scrape(port)
        check(value(m7, "polykv_pools_restored_total") == 2, "restored from the imported file")
        check(value(m7, "polykv_prefill_tokens_total") == 0, "no prefill after import")
        check(value(m7, "polykv_persisted_pools") == 1, "one pool file again")
        # A corrupt file is refused by import.
        with open(exported, "r+b") as f:
            f.seek(-10, 2)
            byte = f.read(1)
            f.seek(-10, 2)
            f.write(bytes([byte[0] ^ 1]))
        r = cli("pools", "import", exported, "--state-dir", f"{TMP}/other")
        check(r.returncode != 0 and "DATA_LOSS" in r.stderr, "import refuses a corrupt file")
    finally:
        if agent is not None:
            agent.kill()
            agent.wait()
        if daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
        for name in os.listdir("/dev/shm"):
            if ("/" + name).startswith(PREFIX):
                os.unlink("/dev/shm/" + name)
        if failures:
            print(open(log).read(), file=sys.stderr)
        shutil.rmtree(TMP, ignore_errors=True)
    print(f"metrics_scrape_test: {checked[0]} checks, {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
