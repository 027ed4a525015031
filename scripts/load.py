#!/usr/bin/env python3
"""Replays a request trace against an OpenAI-compatible endpoint and reports time to first
token (p50, p99), time per output token, throughput and errors.

Python 3.9+ standard library only: asyncio schedules the requests, each runs on a worker
thread with http.client (streamed chat completions, server-sent events). Bounded: at most
--max-requests requests, started within --duration seconds, each given --timeout
seconds; loopback addresses only.

Workloads:
  --scenario chat --clients N    N clients in a closed loop, each sending the next chat
                                 request as soon as its last one finished (steady load).
  --scenario agent-burst         one long background request, then, while it runs, a
                                 burst of short interactive requests (an assistant's tool
                                 calls); reports TTFT per priority class.
  --scenario soak --rss-pid PID  the chat loop with the hostile mix below (defaults: 10%
                                 cancelled, 5% malformed, 2% slow) and the soak checks,
                                 resident memory measured from the end of --warmup
                                 seconds; run it with --clients 16 --duration 600
                                 --max-requests 10000.
  --trace FILE                   a JSON-lines trace, one request a line, replayed open-loop
                                 at its arrival times: {"at": seconds from start,
                                 "messages": [...] or "prompt": "...", "max_tokens": N,
                                 "priority": "interactive"|"background"}.

Hostile mix (for soak runs): --cancel-share P closes a share P of the streams after their
first token (the server should cancel them); --malformed-share P sends a share P of the
requests with a broken JSON body (a 400 is the right answer, not an error); --slow-share P
sends a share P of the bodies half, then stalls --slow-stall seconds (past the server's
body timeout: a 408, or the connection closed, is the right answer).
Soak checks: --rss-pid PID samples the server's resident memory each second (reported
as medians over the minute after --warmup seconds and over the last minute, the largest,
and a median per minute); --expect-idle waits after the run for hetsched's /metrics to
show no request in the engine and no KV memory held (an error if that does not come
within 30 s), then samples the idle resident memory 3 s later.

Examples:
  scripts/load.py --url http://127.0.0.1:8080 --scenario chat --clients 4 --max-requests 32
  scripts/load.py --url http://127.0.0.1:8080 --scenario agent-burst --json
  scripts/load.py --url http://127.0.0.1:8080 --scenario soak --clients 16 --duration 600 \
      --max-requests 10000 --max-tokens 16 --rss-pid PID
"""

import argparse
import asyncio
import http.client
import ipaddress
import json
import math
import random
import socket
import statistics
import sys
import time
import urllib.parse

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in two sentences why the sky is blue.",
    "Give three tips for writing clear code.",
    "What is 17 times 23? Answer briefly.",
    "Name four planets of the solar system.",
    "Summarise the plot of Romeo and Juliet in one sentence.",
    "Translate 'good morning' into French, Spanish and German.",
]

LONG_DOCUMENT = " ".join(
    f"Section {i}: the scheduler places each subgraph on the processor that suits it, "
    "and the memory planner frees buffers as soon as their last reader is done."
    for i in range(12)
)


def chat_request(text, max_tokens, priority="interactive"):
    return {
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "priority": priority,
    }


def scenario_chat(clients, max_requests, max_tokens, seed):
    """Closed loop: (client, request) pairs, each client sends in turn."""
    rng = random.Random(seed)
    return [
        (i % clients, 0.0, chat_request(rng.choice(PROMPTS), max_tokens))
        for i in range(max_requests)
    ]


def scenario_agent_burst(max_tokens):
    """Open loop: a background summary at 0 s, five interactive tool calls from 0.5 s."""
    trace = [
        (
            None,
            0.0,
            chat_request(
                "Summarise this document:\n" + LONG_DOCUMENT, 4 * max_tokens, "background"
            ),
        )
    ]
    for i in range(5):
        trace.append(
            (None, 0.5 + 0.2 * i, chat_request(PROMPTS[i], max_tokens // 2 or 1))
        )
    return trace


def read_trace(path, max_requests):
    trace = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                at = float(entry.pop("at", 0.0))
            except (ValueError, TypeError) as e:
                sys.exit(f"{path}:{number}: not a trace entry ({e})")
            trace.append((None, at, entry))
            if len(trace) >= max_requests:
                break
    return trace


class Result:
    def __init__(self, priority):
        self.priority = priority
        self.kind = "normal"
        self.ttft = None
        self.tokens = 0
        self.chunks = 0
        self.end = None
        self.error = None
        self.start = None


def run_slow(parts, endpoint, payload, headers, stall, timeout, result):
    """Sends half of the body, stalls `stall` seconds, then the rest; a 408 or a closed
    connection is the right answer."""
    head = f"POST {endpoint} HTTP/1.1\r\nHost: {parts.hostname}\r\n" + "".join(
        f"{k}: {v}\r\n" for k, v in headers.items()
    )
    data = payload.encode()
    head += f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
    status = None
    with socket.create_connection((parts.hostname, parts.port), timeout=timeout) as sock:
        try:
            sock.sendall(head.encode() + data[: len(data) // 2])
            time.sleep(stall)
            sock.sendall(data[len(data) // 2:])
        except OSError:
            pass  # the server closed the connection: an answer the stall deserves
        try:
            line = sock.makefile("rb").readline().decode("latin-1")
            status = int(line.split()[1]) if line.startswith("HTTP/") else None
        except (OSError, ValueError, IndexError):
            status = None
    if status not in (None, 408):
        result.error = f"slow body answered HTTP {status}"
    result.end = time.monotonic() - result.start
    return result


def run_one(url, body, timeout, api_key, model, kind="normal", stall=0.0):
    """One streamed request on this thread; returns a Result. `kind`: normal, cancel
    (close after the first token), malformed (a broken body; 400 expected) or slow (a
    body stalled `stall` seconds halfway; 408 or a closed connection expected)."""
    parts = urllib.parse.urlsplit(url)
    result = Result(body.get("priority", "interactive"))
    result.kind = kind
    body = dict(body, stream=True, stream_options={"include_usage": True})
    if model:
        body["model"] = model
    endpoint = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    result.start = time.monotonic()
    if kind == "slow":
        try:
            return run_slow(parts, endpoint, json.dumps(body), headers, stall, timeout, result)
        except OSError as e:
            result.error = f"{type(e).__name__}: {e}"
            return result
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        payload = json.dumps(body)
        if kind == "malformed":
            payload = payload[: len(payload) // 2]
        connection.request("POST", endpoint, payload, headers)
        response = connection.getresponse()
        if kind == "malformed":
            response.read()
            if response.status != 400:
                result.error = f"malformed body answered HTTP {response.status}"
            result.end = time.monotonic() - result.start
            return result
        if response.status != 200:
            result.error = f"HTTP {response.status}"
            response.read()
            return result
        while True:
            line = response.readline()
            if not line:
                result.error = "stream ended without [DONE]"
                break
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            if chunk.get("usage"):
                result.tokens = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices", []):
                piece = choice.get("delta", {}).get("content") or choice.get("text")
                if piece:
                    if result.ttft is None:
                        result.ttft = time.monotonic() - result.start
                    result.chunks += 1
            if kind == "cancel" and result.ttft is not None:
                break
        result.end = time.monotonic() - result.start
    except (OSError, http.client.HTTPException, ValueError) as e:
        result.error = f"{type(e).__name__}: {e}"
    finally:
        connection.close()
    return result


async def replay(args, trace):
    results = []
    deadline = time.monotonic() + args.duration
    start = time.monotonic()

    rng = random.Random(args.seed + 1)

    async def send(body):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        draw = rng.random()
        kind = "normal"
        if draw < args.cancel_share:
            kind = "cancel"
        elif draw < args.cancel_share + args.malformed_share:
            kind = "malformed"
        elif draw < args.cancel_share + args.malformed_share + args.slow_share:
            kind = "slow"
        # A request started before the deadline keeps its whole --timeout: the run is
        # bounded by --duration plus one --timeout.
        timeout = args.timeout
        results.append(
            await asyncio.to_thread(
                run_one, args.url, body, timeout, args.api_key, args.model, kind,
                args.slow_stall,
            )
        )

    closed = [entry for entry in trace if entry[0] is not None]
    open_loop = [entry for entry in trace if entry[0] is None]

    async def client(index):
        for owner, _, body in closed:
            if owner == index and time.monotonic() < deadline:
                await send(body)

    async def arrival(at, body):
        await asyncio.sleep(max(0.0, start + at - time.monotonic()))
        await send(body)

    rss = []

    async def sample_rss():
        while True:
            kib = resident_kib(args.rss_pid)
            if kib is not None:
                rss.append((time.monotonic() - start, kib))
            await asyncio.sleep(1.0)

    sampler = asyncio.create_task(sample_rss()) if args.rss_pid else None
    clients = sorted({entry[0] for entry in closed})
    await asyncio.gather(
        *(client(i) for i in clients), *(arrival(at, body) for _, at, body in open_loop)
    )
    wall = time.monotonic() - start
    if sampler:
        sampler.cancel()
        kib = resident_kib(args.rss_pid)
        if kib is not None:
            rss.append((wall, kib))
    return results, wall, rss


def resident_kib(pid):
    """The process's resident memory (VmRSS), KiB; None if it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def wait_idle(url, api_key, seconds=30.0):
    """Polls hetsched's /metrics until no request is in the engine and no KV memory is
    held; returns (seconds waited, None) or (None, what was still held)."""
    parts = urllib.parse.urlsplit(url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    start = time.monotonic()
    held = "no answer"
    while time.monotonic() - start < seconds:
        try:
            connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=5)
            connection.request("GET", "/metrics", headers=headers)
            text = connection.getresponse().read().decode()
            connection.close()
            gauges = {}
            for line in text.splitlines():
                for name in ("hetsched_kv_cache_bytes ",
                             'hetsched_requests_in_engine{state="queued"} ',
                             'hetsched_requests_in_engine{state="running"} '):
                    if line.startswith(name):
                        gauges[name.strip()] = float(line[len(name):])
            held = ", ".join(f"{k} = {v:g}" for k, v in gauges.items() if v)
            if len(gauges) == 3 and not held:
                return round(time.monotonic() - start, 2), None
        except (OSError, http.client.HTTPException, ValueError) as e:
            held = f"{type(e).__name__}: {e}"
        time.sleep(0.2)
    return None, held


def rss_report(rss, warmup, wall):
    """Resident memory from (seconds, KiB) samples taken under load. A server's resident
    memory under load follows the requests it holds at the moment, so single samples
    are compared as medians: over the minute after the warm-up and over the run's last
    minute (the change between them says whether it grows), the largest, and a median
    per minute."""
    def median_between(start, end):
        inside = [kib for at, kib in rss if start <= at < end]
        return int(statistics.median(inside)) if inside else None

    settled = median_between(warmup, warmup + 60) or rss[-1][1]
    last = median_between(max(warmup, wall - 60), wall + 1) or rss[-1][1]
    report = {
        "rss_start_kib": rss[0][1],
        "rss_after_warmup_kib": settled,
        "rss_last_minute_kib": last,
        "rss_max_kib": max(kib for _, kib in rss),
        "rss_change_pct": round(100 * (last - settled) / settled, 2),
    }
    minutes = max(1, math.ceil(wall / 60))
    report["rss_by_minute_kib"] = [
        median_between(60 * m, 60 * (m + 1)) for m in range(minutes)
    ]
    return report


def percentile(values, q):
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def summarise(results, wall):
    hostile = [r for r in results if r.kind != "normal"]
    results = [r for r in results if r.kind == "normal"] + [
        r for r in hostile if r.error is not None
    ]
    ok = [r for r in results if r.error is None]
    ttft = [r.ttft for r in ok if r.ttft is not None]
    tpot = [
        (r.end - r.ttft) / (r.tokens - 1)
        for r in ok
        if r.ttft is not None and r.tokens > 1
    ]
    tokens = sum(r.tokens for r in ok)
    report = {
        "requests": len(results),
        "hostile_requests": len(hostile),
        "hostile_by_kind": {
            kind: sum(r.kind == kind for r in hostile)
            for kind in sorted({r.kind for r in hostile})
        },
        "errors": len(results) - len(ok),
        "error_kinds": sorted({r.error for r in results if r.error}),
        "wall_s": round(wall, 3),
        "ttft_p50_ms": ms(percentile(ttft, 50)),
        "ttft_p99_ms": ms(percentile(ttft, 99)),
        "tpot_median_ms": ms(statistics.median(tpot) if tpot else None),
        "output_tokens": tokens,
        "tokens_per_s": round(tokens / wall, 2) if wall > 0 else None,
    }
    for priority in sorted({r.priority for r in ok}):
        of = [r.ttft for r in ok if r.priority == priority and r.ttft is not None]
        report[f"ttft_p50_ms_{priority}"] = ms(percentile(of, 50))
        report[f"ttft_p99_ms_{priority}"] = ms(percentile(of, 99))
    return report


def ms(seconds):
    return None if seconds is None else round(seconds * 1000, 1)


def check_loopback(url):
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or not parts.port:
        sys.exit(f"--url {url}: give http://HOST:PORT")
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(parts.hostname, parts.port)}
    except OSError as e:
        sys.exit(f"--url {url}: {e}")
    if not all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses):
        sys.exit(f"--url {url}: this load script only targets loopback addresses")


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--scenario", choices=["chat", "agent-burst", "soak"], default="chat")
    parser.add_argument("--trace", help="JSON-lines trace (replaces --scenario)")
    parser.add_argument("--clients", type=int, default=4, help="chat: concurrent clients")
    parser.add_argument("--max-requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--duration", type=float, default=120.0, help="seconds at most")
    parser.add_argument("--timeout", type=float, default=60.0, help="per request, seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--api-key")
    parser.add_argument("--model", help="model name to send (llama-server ignores it)")
    parser.add_argument("--cancel-share", type=float, help="default 0 (soak: 0.1)")
    parser.add_argument("--malformed-share", type=float, help="default 0 (soak: 0.05)")
    parser.add_argument("--slow-share", type=float, help="default 0 (soak: 0.02)")
    parser.add_argument(
        "--warmup", type=float, default=0.0,
        help="seconds before resident memory counts as settled (soak: default 60)",
    )
    parser.add_argument(
        "--slow-stall", type=float, default=11.0,
        help="seconds a slow body stalls halfway (past the server's body timeout)",
    )
    parser.add_argument("--rss-pid", type=int, help="the server's process id (soak)")
    parser.add_argument(
        "--expect-idle", action="store_true",
        help="after the run, wait for hetsched's /metrics to show nothing held",
    )
    parser.add_argument(
        "--temperature", type=float, help="sent with every request (default: the server's)"
    )
    parser.add_argument(
        "--ignore-eos",
        action="store_true",
        help="send ignore_eos (llama-server's and hetsched's extension): every request "
        "generates its max_tokens, so both servers produce the same token counts",
    )
    parser.add_argument(
        "--no-prompt-cache",
        action="store_true",
        help="send cache_prompt: false (llama-server's field; hetsched ignores it): "
        "llama-server then prefills every prompt whole rather than reusing the KV of a "
        "prompt prefix it served before",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args()
    soak = args.scenario == "soak"
    for name, soak_default in (("cancel_share", 0.1), ("malformed_share", 0.05),
                               ("slow_share", 0.02)):
        if getattr(args, name) is None:
            setattr(args, name, soak_default if soak else 0.0)
    if soak:
        if not args.rss_pid:
            sys.exit("--scenario soak: give the server's --rss-pid")
        args.expect_idle = True
        if args.warmup == 0.0:
            args.warmup = min(60.0, args.duration / 4)
    if not 0 <= args.warmup < args.duration:
        sys.exit("--warmup: give 0 seconds up to the --duration")
    for name in ("clients", "max_requests", "max_tokens"):
        if not 1 <= getattr(args, name) <= 10_000:
            sys.exit(f"--{name.replace('_', '-')}: give 1 to 10000")
    shares = (args.cancel_share, args.malformed_share, args.slow_share)
    if not (all(0 <= share for share in shares) and sum(shares) <= 1):
        sys.exit("--cancel-share, --malformed-share and --slow-share: shares in [0, 1], "
                 "summing to 1 at most")
    if not 0 <= args.slow_stall <= 60:
        sys.exit("--slow-stall: give 0 to 60 seconds")
    if not 0 < args.duration <= 3600:
        sys.exit("--duration: give 0 to 3600 seconds")
    check_loopback(args.url)
    if args.trace:
        trace = read_trace(args.trace, args.max_requests)
    elif args.scenario in ("chat", "soak"):
        trace = scenario_chat(args.clients, args.max_requests, args.max_tokens, args.seed)
    else:
        trace = scenario_agent_burst(args.max_tokens)
    for _, _, body in trace:
        if args.temperature is not None:
            body["temperature"] = args.temperature
        if args.ignore_eos:
            body["ignore_eos"] = True
        if args.no_prompt_cache:
            body["cache_prompt"] = False
    results, wall, rss = asyncio.run(replay(args, trace))
    report = summarise(results, wall)
    if args.rss_pid:
        if rss:
            report.update(rss_report(rss, args.warmup, wall))
        else:
            report["errors"] += 1
            report["error_kinds"].append(f"process {args.rss_pid} not found")
    if args.expect_idle:
        waited, held = wait_idle(args.url, args.api_key)
        report["idle_after_s"] = waited
        if held is not None:
            report["errors"] += 1
            report["error_kinds"].append(f"not idle 30 s after the run: {held}")
        elif args.rss_pid:
            # Idle: what the server holds with no request (hetsched returns freed memory
            # a second after its last request).
            time.sleep(3.0)
            report["rss_idle_after_kib"] = resident_kib(args.rss_pid)
    if args.json:
        print(json.dumps(report))
    else:
        for key, value in report.items():
            print(f"{key:24} {value}")
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
