#!/usr/bin/env python3
"""Many generation requests on one model from Python, through the ctypes binding
hetsched.py: a background request streamed through callbacks while an interactive one
is generated with the blocking generate(), a request whose token callback raises (the
binding cancels it: no exception reaches the library), and bad input raised as
hetsched.Error with its status.

    python3 examples/python/stream_requests.py LIBRARY MODEL.gguf

Exits 0 when every expectation held and no handle was left alive, 1 otherwise."""
import sys
import threading

import hetsched

failures = []


def expect(ok: bool, what: str) -> None:
    if not ok:
        print(f"expectation failed: {what}", file=sys.stderr)
        failures.append(what)


def raised_status(call) -> str:
    """The status name `call` raises, or "HS_OK"."""
    try:
        call()
    except hetsched.Error as error:
        print(f"raises as expected: {error}")
        return error.status
    return "HS_OK"


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    lib = hetsched.Library(sys.argv[1])
    model = sys.argv[2]
    with lib.requests(model, max_requests=8, threads=2, chunk_len=8) as engine:
        # Background, streamed: callbacks come one at a time on the event thread.
        background_text, background_done, background_end = [], threading.Event(), []

        def background_finish(_request, status, result):
            background_end.append((status, result))
            background_done.set()

        engine.submit("Once upon a time, in a small village by the sea, there lived an old "
                      "fisherman who every morning", max_tokens=24,
                      priority=hetsched.HS_PRIORITY_BACKGROUND,
                      on_token=lambda _request, _sample, text: background_text.append(text),
                      on_finish=background_finish)

        texts, (status, result) = engine.generate("The capital of France is", max_tokens=12)
        text = texts[0]
        print(f"[interactive] {status}: {text!r}\n  {result}")
        expect(status == "HS_OK", "the interactive request ends HS_OK")
        expect("Paris" in text, "the greedy answer names Paris")
        expect(result.get("finish_reason") == "length", "it ends at its token limit")
        expect(result.get("metrics", {}).get("generated_tokens") == 12, "12 tokens generated")

        # Two greedy samples with a stop string: equal, each cut before it.
        texts, (status, result) = engine.generate("The capital of France is", max_tokens=12,
                                                  n=2, stop=["French"])
        print(f"[2 samples, stop 'French'] {status}: {texts}\n  {result}")
        expect("French" in text and texts == [text[:text.index("French")]] * 2,
               "both samples end before the stop string")
        expect(result.get("finish_reasons") == ["stop", "stop"], "both stopped by it")

        def give_up(_request, _sample, _text):
            raise RuntimeError("the host gave up (raised on purpose)")

        thrown_done, thrown_end = threading.Event(), []
        engine.submit("Count from one to one hundred:", max_tokens=200, on_token=give_up,
                      on_finish=lambda _r, s, res: (thrown_end.append((s, res)),
                                                    thrown_done.set()))
        thrown_done.wait()
        print(f"[raising callback] {thrown_end[0][0]}: {thrown_end[0][1]}")
        expect(thrown_end[0][0] == "HS_ERR_CANCELLED", "a raising callback cancels its request")
        expect(thrown_end[0][1].get("finish_reason") == "cancelled", "its reason is cancelled")

        background_done.wait()
        print(f"[background] {background_end[0][0]}: {''.join(background_text)!r}")
        expect(background_end[0][0] == "HS_OK" and background_text,
               "the background request ends HS_OK with text")

        expect(raised_status(lambda: engine.submit("", max_tokens=4))
               == "HS_ERR_INVALID_ARGUMENT", "an empty prompt is HS_ERR_INVALID_ARGUMENT")
        expect(raised_status(lambda: engine.submit("Hello", max_tokens=0))
               == "HS_ERR_INVALID_ARGUMENT", "max_tokens 0 is HS_ERR_INVALID_ARGUMENT")
        expect(raised_status(lambda: engine.submit("Hello", stop=[""]))
               == "HS_ERR_INVALID_ARGUMENT", "an empty stop string is HS_ERR_INVALID_ARGUMENT")
        expect(raised_status(lambda: engine.submit("Hello", n=hetsched.HS_MAX_SAMPLES + 1))
               == "HS_ERR_INVALID_ARGUMENT", "too many samples is HS_ERR_INVALID_ARGUMENT")
        expect(raised_status(lambda: engine.cancel(12345)) == "HS_ERR_UNKNOWN_REQUEST",
               "cancelling an unknown request is HS_ERR_UNKNOWN_REQUEST")
        metrics = engine.metrics()
        print(f"engine: {metrics}")
        expect(metrics["finished"] == 4 and metrics["cancelled"] == 1,
               "4 requests finished, 1 of them cancelled")
        # A request still live when the engine closes ends cancelled, its callback called.
        closed_end = []
        engine.submit("Write a long story about the sea.", max_tokens=500,
                      on_finish=lambda _r, s, _res: closed_end.append(s))
    expect(closed_end == ["HS_ERR_CANCELLED"], "close cancels a live request")
    expect(raised_status(lambda: lib.requests("no/such/model.gguf")) == "HS_ERR_LOAD",
           "a missing model is HS_ERR_LOAD")
    if lib.live_handles() != 0:
        print(f"{lib.live_handles()} handles left alive", file=sys.stderr)
        failures.append("handles left alive")
    if failures:
        return 1
    print("stream_requests: every expectation held")
    return 0


if __name__ == "__main__":
    sys.exit(main())
