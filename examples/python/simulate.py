#!/usr/bin/env python3
"""Simulate a scene through the shared library with ctypes (the binding hetsched.py
beside this script): load, plan, simulate, print the report's makespan and the
policies.

    python3 examples/python/simulate.py LIBRARY [SCENE] [POLICY]

LIBRARY is libhetsched_capi.so (target/debug or target/release after
`cargo build -p hetsched-capi`). Exits 1 on any failing status, with the library's
message."""
import sys

import hetsched


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    lib = hetsched.Library(sys.argv[1])
    scene_name = sys.argv[2] if len(sys.argv) > 2 else None
    policy = sys.argv[3] if len(sys.argv) > 3 else None
    print(f"ABI version {lib.abi_version()}")
    try:
        with lib.scene(scene_name) as scene, scene.plan() as plan, \
                plan.simulate(policy) as run:
            makespan_ns = run.makespan_ns()
            report = run.report()
        if abs(report["makespan_ms"] - makespan_ns / 1e6) > 1e-3:
            raise RuntimeError("the report's makespan disagrees with hs_run_makespan_ns")
        print(f"{report['scene']}: {report['policy']} makespan {report['makespan_ms']:.3f} ms "
              f"(predicted), {report['ratio_to_lower_bound']:.3f}x the lower bound; "
              f"policies: {', '.join(lib.policy_names())}")
    except (hetsched.Error, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if lib.live_handles() != 0:
        print("handles left alive", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
