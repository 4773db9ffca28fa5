"""Benchmark: the Ostrich engine vs newton's SolverSemiImplicit on the robot-over-pallet scene.

For each world count: per-step time and Newton statistics (best iteration, residual) of a
`duration` rollout at h = 0.1 s stepped from Python (`SolverOstrich.step`, a status read per step),
then the same rollout in SolverSemiImplicit at its largest stable step (found by trying steps from
large to small on one world), and the time ratio (first table). Then the same rollout through
`Simulation.forward` (recorded steps replayed, one read at the end: what the replay and the fit
run), once as one Simulation of all worlds and, on the CPU, once with the worlds split across
``--threads`` Simulations stepped on worker threads (`sysid.engine.parallel`), with the time per
world-step (throughput: linear in worlds when it stays flat), the threads' speed-up, whether the
split rollout equals the whole one bit for bit, and the ratios to SemiImplicit (second table).

    python benchmarks/bench_engine.py                      # 1, 64, 1024 worlds, 6 s, CPU, 2 threads
    python benchmarks/bench_engine.py --worlds 1 4 --duration 1 --semi-dt 5e-4 --semi-max-steps 200
    python benchmarks/bench_engine.py --device cuda:0      # on a GPU (no thread split there)

Multi-world SemiImplicit rollouts longer than --semi-max-steps steps are timed on that many steps and
extrapolated linearly (printed as such). Timings are wall clock; nothing is asserted.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import newton
import numpy as np
import warp as wp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sysid.engine import Simulation, SolverOptions, SolverOstrich, run_threads, split_counts  # noqa: E402
from sysid.robot import load_robot  # noqa: E402
from sysid.robot.scenes import Scene, WorldSpec, build_robot_scene  # noqa: E402

W_DRIVE = 1.0 / 0.36  # [rad/s]: 1 m/s with 0.36 m wheels
PALLET = (2.0, 0.0, 0.0)
# Penalty parameters for SolverSemiImplicit (newton's defaults, ke = 2.5e3 N/m and a 1e4 N/m joint
# attachment, let the 106 kg robot sink and its wheels sag): about 2 mm static contact compression.
SEMI_CONTACT = {"ke": 1.0e5, "kd": 2.0e3, "kf": 1.0e3}
SEMI_ATTACH = {"joint_attach_ke": 1.0e5, "joint_attach_kd": 1.0e3}
SEMI_DT_CANDIDATES = (3e-3, 2e-3, 1.5e-3, 1.25e-3, 1e-3, 7.5e-4, 5e-4, 2.5e-4)


def scene(worlds: int, device: str = "cpu") -> Scene:
    return build_robot_scene([WorldSpec(pallet=PALLET) for _ in range(worlds)], load_robot(), device=device)


def start(sc: Scene) -> tuple[newton.State, newton.State, newton.Control]:
    m = sc.model
    s0, s1 = m.state(), m.state()
    newton.eval_fk(m, m.joint_q, m.joint_qd, s0)
    c = m.control()
    qd = c.joint_target_qd.numpy()
    qd0 = m.joint_qd_start.numpy()
    for hnd in sc.handles:
        for j in hnd.wheel_joints:
            qd[qd0[j]] = W_DRIVE
    c.joint_target_qd.assign(qd)
    return s0, s1, c


def chassis(sc: Scene, s: newton.State) -> np.ndarray:
    return s.body_q.numpy()[[h.chassis for h in sc.handles], :3]


@dataclass
class OstrichResult:
    worlds: int
    steps: int
    step_ms: float
    total_s: float
    best_iter_mean: float
    residual_median: float
    residual_p95: float
    residual_max: float
    converged_frac: float
    x_final_min: float
    z_peak_min: float


def option_overrides(pairs: list[str]) -> dict:
    """``--set name=value ...`` as SolverOptions keyword arguments (each value cast to the field's type; an
    optional field's to a whole number, a number or None)."""
    kw: dict = {}
    base = SolverOptions()
    for s in pairs:
        k, _, v = s.partition("=")
        if not hasattr(base, k) or k.startswith("_"):
            raise SystemExit(f"--set {s}: SolverOptions has no field {k!r}")
        cur = getattr(base, k)
        if isinstance(cur, bool):
            kw[k] = v.lower() in ("1", "true", "yes")
        elif isinstance(cur, str):  # a closed set (a StrEnum): the string, which SolverOptions takes and checks
            kw[k] = v
        elif cur is None:  # an optional field (lanes, adjoint_krylov_tol): a number, or none
            kw[k] = None if v.lower() == "none" else (int(v) if v.lstrip("-").isdigit() else float(v))
        else:
            kw[k] = type(cur)(v)
    return kw


def run_ostrich(worlds: int, duration: float, h: float, options: SolverOptions | None = None,
                device: str = "cpu") -> OstrichResult:
    sc = scene(worlds, device)
    solver = SolverOstrich(sc.model, options)
    s0, s1, c = start(sc)
    solver.step(s0, s1, c, None, h)  # warm-up (kernel load, launch recording)
    s0, s1, c = start(sc)
    steps = int(round(duration / h))
    bk, res, conv = [], [], []
    z_peak = np.zeros(worlds)
    t0 = time.perf_counter()
    for _ in range(steps):
        solver.step(s0, s1, c, None, h)
        s0, s1 = s1, s0
        st = solver.status()  # a host sync per step, as a user loop would have
        bk.append(st.best_iteration)
        res.append(st.residual)
        conv.append(st.converged | st.stalled)  # below tol, or stopped at the float32 floor below stall_tol
        z_peak = np.maximum(z_peak, chassis(sc, s0)[:, 2])
    total = time.perf_counter() - t0
    res_a = np.asarray(res)
    return OstrichResult(
        worlds, steps, 1e3 * total / steps, total, float(np.mean(bk)), float(np.median(res_a)),
        float(np.percentile(res_a, 95)), float(res_a.max()), float(np.mean(conv)),
        float(chassis(sc, s0)[:, 0].min()), float(z_peak.min()),
    )


def semi_solver(sc: Scene) -> newton.solvers.SolverSemiImplicit:
    m = sc.model
    m.shape_material_ke.fill_(SEMI_CONTACT["ke"])
    m.shape_material_kd.fill_(SEMI_CONTACT["kd"])
    m.shape_material_kf.fill_(SEMI_CONTACT["kf"])
    return newton.solvers.SolverSemiImplicit(m, **SEMI_ATTACH)


def run_semi(worlds: int, duration: float, dt: float, max_steps: int | None = None, device: str = "cpu") -> dict:
    """Roll out in SolverSemiImplicit; returns time (measured or extrapolated) and whether it stayed sane."""
    sc = scene(worlds, device)
    solver = semi_solver(sc)
    pipe = newton.CollisionPipeline(sc.model)
    contacts = pipe.contacts()
    s0, s1, c = start(sc)
    steps = int(round(duration / dt))
    n = steps if max_steps is None else min(steps, max_steps)
    ok = True
    z_peak = np.zeros(worlds)
    t0 = time.perf_counter()
    for k in range(n):
        pipe.collide(s0, contacts)
        s0.clear_forces()
        solver.step(s0, s1, c, contacts, dt)
        s0, s1 = s1, s0
        if (k + 1) % 200 == 0 or k == n - 1:
            p = chassis(sc, s0)
            z_peak = np.maximum(z_peak, p[:, 2])
            if not (np.all(np.isfinite(p)) and np.all((p[:, 2] > 0.2) & (p[:, 2] < 1.0))):
                ok = False
                break
    wp.synchronize()
    measured = time.perf_counter() - t0
    done = k + 1
    p = chassis(sc, s0)
    return {
        "dt": dt, "steps": steps, "timed_steps": done, "ok": ok, "step_ms": 1e3 * measured / done,
        "total_s": measured * steps / done, "extrapolated": done < steps, "x_final_min": float(p[:, 0].min()),
        "z_peak_min": float(z_peak.min()),
    }


def find_stable_dt(duration: float, candidates=SEMI_DT_CANDIDATES, device: str = "cpu") -> tuple[float, list[dict]]:
    """Largest candidate step whose one-world rollout stays finite with the chassis in 0.2..1.0 m and
    drives on (x > 1 m after the rollout)."""
    tried = []
    for dt in candidates:
        r = run_semi(1, duration, dt, device=device)
        tried.append(r)
        stable = r["ok"] and r["x_final_min"] > 1.0
        print(f"  SemiImplicit dt={dt:g}: {'stable' if stable else 'UNSTABLE'} (x_final {r['x_final_min']:.3f} m, "
              f"peak z {r['z_peak_min']:.3f} m, {r['step_ms']:.2f} ms/step)", flush=True)
        if stable:
            return dt, tried
    raise RuntimeError("no stable SemiImplicit step among the candidates")


@dataclass
class _Part:
    """One Simulation of some of the worlds and its rollout inputs."""

    sim: Simulation
    q0: np.ndarray
    qd0: np.ndarray
    targets: np.ndarray  # (steps, dofs) wheel velocity targets [rad/s]
    chassis: list[int]


def _part(worlds: int, steps: int, h: float, options: SolverOptions | None, device: str) -> _Part:
    sc = scene(worlds, device)
    sim = Simulation(SolverOstrich(sc.model, options), h)
    s0, _, c = start(sc)  # the inputs of run_ostrich: from rest, every wheel commanded W_DRIVE
    tq = np.repeat(c.joint_target_qd.numpy()[None], steps, axis=0)
    return _Part(sim, s0.body_q.numpy(), s0.body_qd.numpy(), tq, [h.chassis for h in sc.handles])


def run_rollout(worlds: int, duration: float, h: float, threads: int = 1, options: SolverOptions | None = None,
                device: str = "cpu", repeat: int = 3) -> dict:
    """`Simulation.forward` of the run_ostrich rollout, the worlds split into ``threads`` Simulations
    stepped on worker threads (`run_threads`; 1: one Simulation on the calling thread). Each part is
    warmed up first on the calling thread (kernel loads; the first forward runs its steps as launches,
    the second records them), the threaded call once (untimed), then ``repeat`` timed calls, the fastest
    kept (the machine may be shared). Returns the time [s], ms per step, us per world-step, every
    world's final chassis x [m] and the trajectories."""
    steps = int(round(duration / h))
    parts = [_part(n, steps, h, options, device) for n in split_counts(worlds, threads)]

    def fwd(p: _Part):
        return lambda: p.sim.forward(p.q0, p.qd0, steps, p.targets)

    for p in parts:
        for _ in range(2):
            fwd(p)()
    key = ("bench_engine", worlds, threads, device)
    run_threads([fwd(p) for p in parts], key)
    total = math.inf
    for _ in range(max(1, repeat)):
        t0 = time.perf_counter()
        outs = run_threads([fwd(p) for p in parts], key)
        total = min(total, time.perf_counter() - t0)
    Q = np.concatenate([o.q for o in outs], axis=1)  # bodies are world-major, none shared
    x_final = np.concatenate([o.q[-1, p.chassis, 0] for o, p in zip(outs, parts, strict=True)])
    return {"worlds": worlds, "threads": len(parts), "steps": steps, "total_s": total, "step_ms": 1e3 * total / steps,
            "world_step_us": 1e6 * total / (steps * worlds), "x_final_min": float(x_final.min()), "Q": Q}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worlds", type=int, nargs="+", default=[1, 64, 1024])
    ap.add_argument("--duration", type=float, default=6.0, help="simulated seconds [s]")
    ap.add_argument("--h", type=float, default=0.1, help="Ostrich step [s]")
    ap.add_argument("--semi-dt", type=float, default=None, help="SemiImplicit step [s] (default: search)")
    ap.add_argument("--semi-max-steps", type=int, default=None,
                    help="time at most this many SemiImplicit steps for more than one world and extrapolate")
    ap.add_argument("--threads", type=int, default=2,
                    help="also time the rollout with the worlds split across this many threads (CPU; 1: no split)")
    ap.add_argument("--device", default="cpu", help="warp device (cpu, cuda:0, ...)")
    ap.add_argument("--repeat", type=int, default=3, help="timed Simulation.forward calls per case (fastest kept)")
    ap.add_argument("--set", nargs="*", default=[], help="SolverOptions fields for Ostrich, name=value "
                    "(e.g. linear_solver=direct)")
    args = ap.parse_args(argv)
    if args.threads < 1:
        ap.error("--threads must be >= 1")
    wp.config.quiet = True
    wp.init()
    dev = args.device
    cpu = wp.get_device(dev).is_cpu
    print(f"{wp.get_device(dev)} benchmark, robot over a {PALLET} pallet, {args.duration} s rollouts, "
          f"Ostrich h = {args.h} s")
    if args.semi_dt is None:
        print("searching the largest stable SemiImplicit step (1 world):")
        semi_dt, _ = find_stable_dt(args.duration, device=dev)
    else:
        semi_dt = args.semi_dt
    print(f"SemiImplicit step: {semi_dt:g} s ({int(round(args.duration / semi_dt))} steps per rollout)")
    opts = SolverOptions(**option_overrides(args.set))
    if args.set:
        print(f"Ostrich options: {' '.join(args.set)}")
    rows = []
    for n in args.worlds:
        o = run_ostrich(n, args.duration, args.h, options=opts, device=dev)
        print(f"[{n} worlds] Ostrich: {o.step_ms:.2f} ms/step, {o.total_s:.2f} s total; best iteration mean "
              f"{o.best_iter_mean:.1f}; residual median {o.residual_median:.1e} p95 {o.residual_p95:.1e} max "
              f"{o.residual_max:.1e} m/s; converged or stalled {o.converged_frac:.0%}; "
              f"min x_final {o.x_final_min:.2f} m, min peak z {o.z_peak_min:.3f} m", flush=True)
        s = run_semi(n, args.duration, semi_dt, args.semi_max_steps if n > 1 else None, device=dev)
        ext = f" (extrapolated from {s['timed_steps']} steps)" if s["extrapolated"] else ""
        print(f"[{n} worlds] SemiImplicit dt={semi_dt:g}: {s['step_ms']:.2f} ms/step, {s['total_s']:.2f} s total{ext}; "
              f"sane {s['ok']}; ratio SemiImplicit/Ostrich {s['total_s'] / o.total_s:.2f}", flush=True)
        r1 = run_rollout(n, args.duration, args.h, 1, options=opts, device=dev, repeat=args.repeat)
        print(f"[{n} worlds] Ostrich rollout, 1 thread: {r1['step_ms']:.2f} ms/step, {r1['world_step_us']:.0f} us per "
              f"world-step; ratio SemiImplicit/Ostrich {s['total_s'] / r1['total_s']:.1f}", flush=True)
        rn = None
        if cpu and args.threads > 1 and n >= args.threads:
            rn = run_rollout(n, args.duration, args.h, args.threads, options=opts, device=dev, repeat=args.repeat)
            rn["identical"] = bool(np.array_equal(rn["Q"], r1["Q"]))
            print(f"[{n} worlds] Ostrich rollout, {rn['threads']} threads: {rn['step_ms']:.2f} ms/step, "
                  f"{rn['world_step_us']:.0f} us per world-step; speed-up {r1['total_s'] / rn['total_s']:.2f}; "
                  f"identical to 1 thread: {rn['identical']}; ratio SemiImplicit/Ostrich "
                  f"{s['total_s'] / rn['total_s']:.1f}", flush=True)
        rows.append((n, o, s, r1, rn))
    print("\n| worlds | Ostrich ms/step | Ostrich 6 s rollout [s] | mean best iter | median / max residual [m/s] "
          "| converged or stalled | SemiImplicit ms/step | SemiImplicit rollout [s] | ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n, o, s, _, _ in rows:
        ext = "*" if s["extrapolated"] else ""
        print(f"| {n} | {o.step_ms:.1f} | {o.total_s:.3g} | {o.best_iter_mean:.1f} | {o.residual_median:.1e} / "
              f"{o.residual_max:.1e} | {o.converged_frac:.0%} | {s['step_ms']:.2f} | {s['total_s']:.1f}{ext} | "
              f"{s['total_s'] / o.total_s:.1f} |")
    nt = args.threads if cpu else 1
    print(f"\nSimulation.forward ({args.duration} s, {wp.get_device(dev)}): one Simulation of all worlds vs the worlds "
          f"split across {nt} threads; us per world-step flat = throughput linear in worlds; ratios = "
          "SemiImplicit rollout time / Ostrich rollout time (* SemiImplicit extrapolated)")
    print(f"\n| worlds (forward) | 1 thread ms/step | 1 thread us/world-step | {nt} threads ms/step | "
          f"{nt} threads us/world-step | speed-up | identical | SemiImplicit rollout [s] | ratio 1 thread | "
          f"ratio {nt} threads |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n, _, s, r1, rn in rows:
        ext = "*" if s["extrapolated"] else ""
        split = ["-"] * 4 if rn is None else [
            f"{rn['step_ms']:.1f}", f"{rn['world_step_us']:.0f}", f"{r1['total_s'] / rn['total_s']:.2f}",
            "yes" if rn["identical"] else "NO"]
        cells = [str(n), f"{r1['step_ms']:.1f}", f"{r1['world_step_us']:.0f}", *split, f"{s['total_s']:.1f}{ext}",
                 f"{s['total_s'] / r1['total_s']:.1f}", "-" if rn is None else f"{s['total_s'] / rn['total_s']:.1f}"]
        print("| " + " | ".join(cells) + " |")

if __name__ == "__main__":
    main()
