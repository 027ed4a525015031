"""A ctypes binding of hetsched's C ABI (capi/include/hetsched.h): no build step, no
binding generator, only the shared library libhetsched_capi.so.

    lib = hetsched.Library("target/release/libhetsched_capi.so")
    with lib.scene() as scene, scene.plan() as plan, plan.simulate("balance") as run:
        print(run.report())
    with lib.requests("models/SmolLM2-135M-Instruct.Q4_1.gguf", threads=2) as engine:
        text, end = engine.generate("The capital of France is", max_tokens=12)

Every failing status raises `hetsched.Error` (its `status` name and the library's
message). Handles are closed by `close()` or by leaving a `with` block. Strings the
library hands out are copied and freed at once (`hs_string_free`).

Request callbacks run on the library's event thread (ctypes takes the GIL for them),
one at a time. The binding keeps each request's callbacks alive from its submit until
its `on_finish`; an exception raised by a callback never reaches the library: it is
printed to stderr and the request is cancelled (it ends with HS_ERR_CANCELLED; its
`on_token` is called no more)."""
import ctypes
import itertools
import json
import sys
import threading
import traceback

HS_OK = 0
HS_PRIORITY_INTERACTIVE = 200
HS_PRIORITY_BACKGROUND = 50
HS_MAX_SAMPLES = 64
HS_MAX_STOP_STRINGS = 16
HS_MAX_STOP_BYTES = 256

_handle = ctypes.c_void_p
_status = ctypes.c_int32

# hs_token_fn and hs_finish_fn. The text arrives as a raw pointer: it is `len` bytes of
# UTF-8, read with string_at.
TOKEN_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32,
                            ctypes.c_void_p, ctypes.c_size_t)
FINISH_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint64, _status, ctypes.c_char_p)


class RequestsLimits(ctypes.Structure):
    """hs_requests_limits: a 0 field takes its default."""
    _fields_ = [("kv_budget_bytes", ctypes.c_uint64), ("max_requests", ctypes.c_uint32),
                ("refuse_when_full", ctypes.c_uint32), ("threads", ctypes.c_uint32),
                ("chunk_len", ctypes.c_uint32)]


class RequestOptions(ctypes.Structure):
    """hs_request_options, field for field."""
    _fields_ = [("max_tokens", ctypes.c_uint32), ("temperature", ctypes.c_float),
                ("top_k", ctypes.c_uint32), ("top_p", ctypes.c_float),
                ("seed", ctypes.c_uint64), ("priority", ctypes.c_uint8),
                ("n", ctypes.c_uint32), ("stop", ctypes.POINTER(ctypes.c_char_p)),
                ("stop_count", ctypes.c_size_t), ("on_token", TOKEN_FN), ("on_finish", FINISH_FN),
                ("user_data", ctypes.c_void_p)]


class Error(RuntimeError):
    """A failing status: `status` is its name (e.g. "HS_ERR_LOAD")."""

    def __init__(self, status: str, message: str):
        super().__init__(f"{status}: {message}")
        self.status = status


# Each function's arguments; every one returns an hs_status.
_SIGNATURES = {
    "hs_scene_load": [ctypes.c_char_p, ctypes.POINTER(_handle)],
    "hs_scene_default": [ctypes.POINTER(_handle)],
    "hs_scene_destroy": [_handle],
    "hs_plan_create": [_handle, ctypes.POINTER(_handle)],
    "hs_plan_destroy": [_handle],
    "hs_simulate": [_handle, ctypes.c_char_p, ctypes.POINTER(_handle)],
    "hs_run_makespan_ns": [_handle, ctypes.POINTER(ctypes.c_uint64)],
    "hs_run_report_json": [_handle, ctypes.POINTER(ctypes.c_void_p)],
    "hs_run_destroy": [_handle],
    "hs_policy_names": [ctypes.POINTER(ctypes.c_void_p)],
    "hs_string_free": [ctypes.c_void_p],
    "hs_requests_open": [ctypes.c_char_p, ctypes.POINTER(RequestsLimits),
                         ctypes.POINTER(_handle)],
    "hs_requests_submit": [_handle, ctypes.c_char_p, ctypes.POINTER(RequestOptions),
                           ctypes.POINTER(ctypes.c_uint64)],
    "hs_requests_cancel": [_handle, ctypes.c_uint64],
    "hs_requests_metrics_json": [_handle, ctypes.POINTER(ctypes.c_void_p)],
    "hs_requests_close": [_handle],
}


class Library:
    """The loaded shared library, its functions declared."""

    # The ABI this binding declares (HS_ABI_VERSION of its header).
    ABI_VERSION = 2

    def __init__(self, path: str):
        self.c = ctypes.CDLL(path)
        self.c.hs_abi_version.restype = ctypes.c_uint32
        if self.c.hs_abi_version() != self.ABI_VERSION:
            raise Error("HS_ERR_STATE", f"{path} has ABI version {self.c.hs_abi_version()}, "
                        f"this binding declares {self.ABI_VERSION}")
        for name, argtypes in _SIGNATURES.items():
            function = getattr(self.c, name)
            function.argtypes = argtypes
            function.restype = _status
        self.c.hs_last_error.restype = ctypes.c_char_p
        self.c.hs_status_name.argtypes = [_status]
        self.c.hs_status_name.restype = ctypes.c_char_p
        self.c.hs_live_handles.restype = ctypes.c_size_t

    def abi_version(self) -> int:
        return self.c.hs_abi_version()

    def live_handles(self) -> int:
        return self.c.hs_live_handles()

    def status_name(self, status: int) -> str:
        return self.c.hs_status_name(status).decode()

    def check(self, status: int, call: str) -> None:
        """Raises Error on a failing status, with this thread's last message."""
        if status != HS_OK:
            message = self.c.hs_last_error()
            raise Error(self.status_name(status),
                        f"{call}: {message.decode() if message else '(no message)'}")

    def take_string(self, pointer: ctypes.c_void_p) -> str:
        """Copies a string the library handed out, and frees it."""
        text = ctypes.string_at(pointer).decode()
        self.check(self.c.hs_string_free(pointer), "hs_string_free")
        return text

    def policy_names(self) -> list:
        text = ctypes.c_void_p()
        self.check(self.c.hs_policy_names(ctypes.byref(text)), "hs_policy_names")
        return json.loads(self.take_string(text))

    def scene(self, name: str = None) -> "Scene":
        """A scene file or shipped scene by name; None: the default scene."""
        return Scene(self, name)

    def requests(self, model_path: str, **limits) -> "Requests":
        """A request engine on a GGUF model; `limits` are hs_requests_limits fields."""
        return Requests(self, model_path, **limits)


class _Handle:
    """One owned handle, destroyed once by close() or at the end of a `with`."""
    _destroy = None

    def __init__(self, lib: Library):
        self.lib = lib
        self.handle = _handle()

    def close(self) -> None:
        if self.handle.value:
            handle, self.handle = self.handle, _handle()
            self.lib.check(getattr(self.lib.c, self._destroy)(handle), self._destroy)

    def __enter__(self):
        return self

    def __exit__(self, *_exc) -> None:
        self.close()


class Scene(_Handle):
    _destroy = "hs_scene_destroy"

    def __init__(self, lib: Library, name: str = None):
        super().__init__(lib)
        if name:
            lib.check(lib.c.hs_scene_load(name.encode(), ctypes.byref(self.handle)),
                      "hs_scene_load")
        else:
            lib.check(lib.c.hs_scene_default(ctypes.byref(self.handle)), "hs_scene_default")

    def plan(self) -> "Plan":
        plan = Plan(self.lib)
        self.lib.check(self.lib.c.hs_plan_create(self.handle, ctypes.byref(plan.handle)),
                       "hs_plan_create")
        return plan


class Plan(_Handle):
    _destroy = "hs_plan_destroy"

    def simulate(self, policy: str = None) -> "Run":
        """Simulates under `policy` (None: the scene's own)."""
        run = Run(self.lib)
        self.lib.check(self.lib.c.hs_simulate(self.handle, policy.encode() if policy else None,
                                              ctypes.byref(run.handle)), "hs_simulate")
        return run


class Run(_Handle):
    _destroy = "hs_run_destroy"

    def makespan_ns(self) -> int:
        ns = ctypes.c_uint64()
        self.lib.check(self.lib.c.hs_run_makespan_ns(self.handle, ctypes.byref(ns)),
                       "hs_run_makespan_ns")
        return ns.value

    def report(self) -> dict:
        """The run's JSON report, parsed."""
        text = ctypes.c_void_p()
        self.lib.check(self.lib.c.hs_run_report_json(self.handle, ctypes.byref(text)),
                       "hs_run_report_json")
        return json.loads(self.lib.take_string(text))


class Requests(_Handle):
    """Many generation requests on one model (hs_requests_*). close() (or the end of
    the `with`) cancels what is live, waits for every request's on_finish and joins
    the library's threads; not from inside a callback."""
    _destroy = "hs_requests_close"

    def __init__(self, lib: Library, model_path: str, **limits):
        super().__init__(lib)
        raw = RequestsLimits(**limits)
        lib.check(lib.c.hs_requests_open(model_path.encode(), ctypes.byref(raw),
                                         ctypes.byref(self.handle)), "hs_requests_open")
        # Each submitted request's callbacks, by the key its user_data carries, until
        # its on_finish. The two C trampolines live as long as this object.
        self._callbacks = {}
        self._keys = itertools.count(1)
        self._lock = threading.Lock()
        self._on_token = TOKEN_FN(self._token_trampoline)
        self._on_finish = FINISH_FN(self._finish_trampoline)

    def submit(self, prompt: str, max_tokens: int = 128, temperature: float = 0.0,
               top_k: int = 0, top_p: float = 1.0, seed: int = 0,
               priority: int = HS_PRIORITY_INTERACTIVE, n: int = 1, stop=(), on_token=None,
               on_finish=None) -> int:
        """Submits `prompt` for `n` samples ending before any of the `stop` strings;
        returns its id. `on_token(id, sample, text)` for each piece of a sample's text,
        `on_finish(id, status_name, result)` once at the end (result: the parsed JSON)."""
        key = next(self._keys)
        with self._lock:
            self._callbacks[key] = [on_token, on_finish]
        stop = [s.encode() for s in stop]
        stop_array = (ctypes.c_char_p * len(stop))(*stop)
        options = RequestOptions(max_tokens=max_tokens, temperature=temperature, top_k=top_k,
                                 top_p=top_p, seed=seed, priority=priority, n=n,
                                 stop=stop_array, stop_count=len(stop),
                                 on_token=self._on_token, on_finish=self._on_finish,
                                 user_data=key)
        request = ctypes.c_uint64()
        status = self.lib.c.hs_requests_submit(self.handle, prompt.encode(),
                                               ctypes.byref(options), ctypes.byref(request))
        if status != HS_OK:
            # Nothing of the request ran: no callback will come for this key.
            with self._lock:
                del self._callbacks[key]
            self.lib.check(status, "hs_requests_submit")
        return request.value

    def generate(self, prompt: str, **options):
        """Submits `prompt` and blocks until it ended: (texts, (status_name, result)),
        one text per sample. Not from a callback (it would wait on its own thread)."""
        # By sample, as text comes: `n` is only trusted once the library accepted it.
        pieces, ended, end = {}, threading.Event(), []

        def token(_request, sample, text):
            pieces.setdefault(sample, []).append(text)

        def finish(_request, status, result):
            end.append((status, result))
            ended.set()

        self.submit(prompt, on_token=token, on_finish=finish, **options)
        ended.wait()
        samples = max(options.get("n", 1), 1)
        return ["".join(pieces.get(i, [])) for i in range(samples)], end[0]

    def cancel(self, request: int) -> None:
        self.lib.check(self.lib.c.hs_requests_cancel(self.handle, request),
                       "hs_requests_cancel")

    def metrics(self) -> dict:
        text = ctypes.c_void_p()
        self.lib.check(self.lib.c.hs_requests_metrics_json(self.handle, ctypes.byref(text)),
                       "hs_requests_metrics_json")
        return json.loads(self.lib.take_string(text))

    def _token_trampoline(self, user_data, request, sample, text, length):
        with self._lock:
            on_token = self._callbacks[user_data][0]
        if on_token is None:
            return
        try:
            on_token(request, sample, ctypes.string_at(text, length).decode())
        except Exception:  # pylint: disable=broad-except
            # No exception may unwind into the library: end the request instead, and
            # give its callback no more text (pieces already on their way still come).
            traceback.print_exc(file=sys.stderr)
            with self._lock:
                self._callbacks[user_data][0] = None
            self.lib.c.hs_requests_cancel(self.handle, request)

    def _finish_trampoline(self, user_data, request, status, result_json):
        # The request's last callback: its entry goes.
        with self._lock:
            on_finish = self._callbacks.pop(user_data)[1]
        if on_finish is None:
            return
        try:
            on_finish(request, self.lib.status_name(status),
                      json.loads(result_json.decode()) if result_json else {})
        except Exception:  # pylint: disable=broad-except
            traceback.print_exc(file=sys.stderr)
