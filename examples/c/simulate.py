#!/usr/bin/env python3
"""Simulate a scene through the shared library with ctypes (no build step, no binding
generator): load, plan, simulate, print the report's makespan and the policies.

    python3 examples/c/simulate.py LIBRARY [SCENE] [POLICY]

LIBRARY is libhetsched_capi.so (target/debug or target/release after
`cargo build -p hetsched-capi`). Exits 1 on any failing status, with the library's
message."""
import ctypes
import json
import sys

HS_OK = 0


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    lib = ctypes.CDLL(sys.argv[1])
    scene_name = sys.argv[2] if len(sys.argv) > 2 else None
    policy = sys.argv[3].encode() if len(sys.argv) > 3 else None

    handle = ctypes.c_void_p
    lib.hs_abi_version.restype = ctypes.c_uint32
    lib.hs_last_error.restype = ctypes.c_char_p
    lib.hs_live_handles.restype = ctypes.c_size_t
    # Strings the library hands out are freed with hs_string_free: keep the raw pointer.
    lib.hs_string_free.argtypes = [ctypes.c_void_p]
    for name in ["hs_scene_load", "hs_scene_default", "hs_plan_create", "hs_simulate",
                 "hs_run_makespan_ns", "hs_run_report_json", "hs_policy_names",
                 "hs_scene_destroy", "hs_plan_destroy", "hs_run_destroy"]:
        getattr(lib, name).restype = ctypes.c_int
    lib.hs_scene_load.argtypes = [ctypes.c_char_p, ctypes.POINTER(handle)]
    lib.hs_scene_default.argtypes = [ctypes.POINTER(handle)]
    lib.hs_plan_create.argtypes = [handle, ctypes.POINTER(handle)]
    lib.hs_simulate.argtypes = [handle, ctypes.c_char_p, ctypes.POINTER(handle)]
    lib.hs_run_makespan_ns.argtypes = [handle, ctypes.POINTER(ctypes.c_uint64)]
    lib.hs_run_report_json.argtypes = [handle, ctypes.POINTER(ctypes.c_void_p)]
    lib.hs_policy_names.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    for name in ["hs_scene_destroy", "hs_plan_destroy", "hs_run_destroy"]:
        getattr(lib, name).argtypes = [handle]

    def check(status: int, call: str) -> None:
        if status != HS_OK:
            message = lib.hs_last_error()
            raise RuntimeError(f"{call}: status {status}: {message.decode() if message else ''}")

    def take_string(pointer: ctypes.c_void_p) -> str:
        text = ctypes.string_at(pointer).decode()
        check(lib.hs_string_free(pointer), "hs_string_free")
        return text

    print(f"ABI version {lib.hs_abi_version()}")
    scene, plan, run = handle(), handle(), handle()
    try:
        if scene_name:
            check(lib.hs_scene_load(scene_name.encode(), ctypes.byref(scene)), "hs_scene_load")
        else:
            check(lib.hs_scene_default(ctypes.byref(scene)), "hs_scene_default")
        check(lib.hs_plan_create(scene, ctypes.byref(plan)), "hs_plan_create")
        check(lib.hs_simulate(plan, policy, ctypes.byref(run)), "hs_simulate")
        makespan = ctypes.c_uint64()
        check(lib.hs_run_makespan_ns(run, ctypes.byref(makespan)), "hs_run_makespan_ns")
        text = ctypes.c_void_p()
        check(lib.hs_run_report_json(run, ctypes.byref(text)), "hs_run_report_json")
        report = json.loads(take_string(text))
        check(lib.hs_policy_names(ctypes.byref(text)), "hs_policy_names")
        policies = json.loads(take_string(text))
        if report["makespan_ms"] != round(makespan.value / 1e6, 6) and \
                abs(report["makespan_ms"] - makespan.value / 1e6) > 1e-3:
            raise RuntimeError("the report's makespan disagrees with hs_run_makespan_ns")
        print(f"{report['scene']}: {report['policy']} makespan {report['makespan_ms']:.3f} ms "
              f"(predicted), {report['ratio_to_lower_bound']:.3f}x the lower bound; "
              f"policies: {', '.join(policies)}")
    except RuntimeError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    finally:
        for destroy, h in [(lib.hs_run_destroy, run), (lib.hs_plan_destroy, plan),
                           (lib.hs_scene_destroy, scene)]:
            if h.value:
                destroy(h)
    if lib.hs_live_handles() != 0:
        print("handles left alive", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
