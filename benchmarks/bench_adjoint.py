"""Benchmark: warm forward + backward (adjoint) time of the 6 s pallet-traversal rollout (CPU).

Ostrich: the robot starts at rest, all wheels commanded 1 m/s (1/0.36 rad/s), and drives over a pallet
2 m ahead: 60 steps at h = 0.1 s, 16 Newton x 16 PCR iterations, `Simulation.forward` then
`Simulation.backward` of L = sum over worlds of the final chassis x. The rollout is run twice to warm
up (kernel loads; the first run launches, the second records the step and adjoint replays, graphs.py)
and timed on the third; with `--launches` also without replays (`Simulation(graphs=False)`), as a ratio.

SemiImplicit: newton's `SolverSemiImplicit` on the same task and scene (penalty contact and joint
attachment parameters of `bench_engine.py`) at dt = 0.5 ms (12,000 steps per 6 s), recorded on a
`wp.Tape` (model finalized with requires_grad=True, one state per step), backward from the same loss.
Collision runs outside the tape, one contact buffer per step (contacts are inputs, not
differentiated). Only ``--semi-steps`` steps are timed and the time is extrapolated linearly to the
full rollout (printed as such): the tape of 12,000 steps does not fit a quick run.

    python benchmarks/bench_adjoint.py                 # 1 and 64 worlds
    python benchmarks/bench_adjoint.py --worlds 1 64 1024
    python benchmarks/bench_adjoint.py --worlds 64 --threads 2 --set adjoint_solver=lu   # LU (default: Krylov)
    python benchmarks/bench_adjoint.py --worlds 1 64 --semi-worlds --checkpoint-every 10   # checkpointed too
    python benchmarks/bench_adjoint.py --device cuda:0 --worlds 1 64 1024 8192 --semi-worlds 1 64
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import newton
import numpy as np
import warp as wp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_engine import PALLET, SEMI_ATTACH, SEMI_CONTACT, W_DRIVE, option_overrides  # noqa: E402

from sysid.engine import Simulation, SolverOptions, SolverOstrich, run_threads, split_counts  # noqa: E402
from sysid.robot import load_robot  # noqa: E402
from sysid.robot.scenes import Scene, WorldSpec, build_robot_scene  # noqa: E402

wp.config.quiet = True
DURATION = 6.0  # [s]
H = 0.1  # [s]


DEVICE = "cpu"  # --device


def scene(worlds: int, requires_grad: bool = False) -> Scene:
    return build_robot_scene([WorldSpec(pallet=PALLET) for _ in range(worlds)], load_robot(), device=DEVICE,
                             requires_grad=requires_grad)


def targets(sc: Scene, steps: int) -> np.ndarray:
    m = sc.model
    qd = np.zeros((steps, m.joint_dof_count), np.float32)
    start = m.joint_qd_start.numpy()
    for hnd in sc.handles:
        for j in hnd.wheel_joints:
            qd[:, start[j]] = W_DRIVE
    return qd


OPTIONS: dict = {}  # --set


def run_ostrich_threads(worlds: int, threads: int, iters: int = 16) -> dict:
    """Forward + backward of the run_ostrich rollout with the worlds split into ``threads`` Simulations on
    worker threads (`sysid.engine.parallel.run_threads`), each part first run alone on the calling thread
    (kernel loads, then its step and adjoint recordings), the threaded call once untimed, then three timed,
    the fastest kept. Returns the time [s] and every world's d(sum of final x)/d(targets)."""
    steps = int(round(DURATION / H))
    parts = []
    for n in split_counts(worlds, threads):
        sc = scene(n)
        solver = SolverOstrich(sc.model, SolverOptions(**{"newton_iters": iters, "pcr_iters": iters,
                                                          "check_contacts": False, **OPTIONS}))
        solver.set_anisotropic_friction([s for h in sc.handles for s in h.wheel_shapes], sc.robot.mu,
                                        sc.robot.mu_lateral)
        sim = Simulation(solver, H)
        s = sc.model.state()
        newton.eval_fk(sc.model, sc.model.joint_q, sc.model.joint_qd, s)
        parts.append((sim, s.body_q.numpy(), s.body_qd.numpy(), targets(sc, steps), [h.chassis for h in sc.handles]))

    def work(p: tuple):
        sim, q0, qd0, tq, ch = p

        def go():
            Q, _ = sim.forward(q0, qd0, steps, tq)
            gQ = np.zeros_like(Q)
            gQ[-1, ch, 0] = 1.0
            return sim.backward(gQ, None).targets_qd

        return go

    for p in parts:
        for _ in range(2):
            work(p)()
    key = ("bench_adjoint", worlds, threads, DEVICE)
    run_threads([work(p) for p in parts], key)
    best = float("inf")
    grads = []
    for _ in range(3):
        t0 = time.perf_counter()
        grads = run_threads([work(p) for p in parts], key)
        best = min(best, time.perf_counter() - t0)
    return {"total_s": best, "grad": np.concatenate(grads, axis=1), "threads": len(parts)}


def run_ostrich(worlds: int, iters: int = 16, graphs: bool = True, checkpoint_every: int | None = None) -> dict:
    sc = scene(worlds)
    m = sc.model
    solver = SolverOstrich(m, SolverOptions(**{"newton_iters": iters, "pcr_iters": iters, "check_contacts": False,
                                               **OPTIONS}))
    solver.set_anisotropic_friction([s for h in sc.handles for s in h.wheel_shapes], sc.robot.mu,
                                    sc.robot.mu_lateral)
    sim = Simulation(solver, H, graphs=graphs, checkpoint_every=checkpoint_every)
    s = m.state()
    newton.eval_fk(m, m.joint_q, m.joint_qd, s)
    q0, qd0 = s.body_q.numpy(), s.body_qd.numpy()
    steps = int(round(DURATION / H))
    tq = targets(sc, steps)
    ch = [h.chassis for h in sc.handles]
    out = {}
    for _rep in range(3):  # the first run loads kernels, the second records the replays
        wp.synchronize_device(DEVICE)
        t0 = time.perf_counter()
        Q, QD = sim.forward(q0, qd0, steps, tq)
        wp.synchronize_device(DEVICE)
        t1 = time.perf_counter()
        gQ = np.zeros_like(Q)
        gQ[-1, ch, 0] = 1.0
        g = sim.backward(gQ, None)
        wp.synchronize_device(DEVICE)
        t2 = time.perf_counter()
        out = {"forward_s": t1 - t0, "backward_s": t2 - t1, "total_s": t2 - t0}
    its = [a for a, _ in sim.adjoint_stats]  # the per-step system size n
    out.update(worlds=worlds, x_final_min=float(Q[-1, ch, 0].min()), z_peak_min=float(Q[:, ch, 2].max(0).min()),
               gmres_mean=float(np.mean(its)), gmres_max=int(max(its)), memory_mib=sim.memory_bytes() / 2**20,
               grad_finite=bool(np.isfinite(g.targets_qd).all()), replays=sim._graphs.replayed,
               grad=g.targets_qd.copy())
    out["sim"] = sim
    return out


def run_semi(worlds: int, dt: float, timed_steps: int) -> dict:
    sc = scene(worlds, requires_grad=True)
    m = sc.model
    m.shape_material_ke.fill_(SEMI_CONTACT["ke"])
    m.shape_material_kd.fill_(SEMI_CONTACT["kd"])
    m.shape_material_kf.fill_(SEMI_CONTACT["kf"])
    solver = newton.solvers.SolverSemiImplicit(m, **SEMI_ATTACH)
    pipe = newton.CollisionPipeline(m)
    steps = int(round(DURATION / dt))
    n = min(steps, timed_steps)
    c = m.control()
    c.joint_target_qd.assign(targets(sc, 1)[0])
    ch = [h.chassis for h in sc.handles]
    result = {}
    for _rep in range(2):  # the first run warms up (kernel loads, adjoint kernels)
        states = [m.state() for _ in range(n + 1)]
        newton.eval_fk(m, m.joint_q, m.joint_qd, states[0])
        contacts = [pipe.contacts() for _ in range(n)]
        loss = wp.zeros(1, dtype=float, device=DEVICE, requires_grad=True)
        idx = wp.array(np.asarray(ch, np.int32), dtype=int, device=DEVICE)
        tape = wp.Tape()
        t0 = time.perf_counter()
        for k in range(n):
            pipe.collide(states[k], contacts[k])
            with tape:
                states[k].clear_forces()
                solver.step(states[k], states[k + 1], c, contacts[k], dt)
        with tape:
            wp.launch(_final_x, len(ch), inputs=[states[n].body_q, idx], outputs=[loss], device=DEVICE)
        wp.synchronize()
        t1 = time.perf_counter()
        tape.backward(loss)
        wp.synchronize()
        t2 = time.perf_counter()
        g = states[0].body_qd.grad.numpy()
        result = {"forward_s": (t1 - t0) * steps / n, "backward_s": (t2 - t1) * steps / n,
                  "total_s": (t2 - t0) * steps / n, "timed_steps": n, "steps": steps,
                  "grad_finite": bool(np.isfinite(g).all()),
                  "x_after": float(states[n].body_q.numpy()[ch, 0].min())}
        tape.reset()
        del states, contacts
    result["worlds"] = worlds
    return result


@wp.kernel
def _final_x(body_q: wp.array(dtype=wp.transform), idx: wp.array(dtype=int), loss: wp.array(dtype=float)):
    i = wp.tid()
    wp.atomic_add(loss, 0, wp.transform_get_translation(body_q[idx[i]])[0])


def main(argv: list[str] | None = None) -> list[dict]:
    global DEVICE
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worlds", type=int, nargs="+", default=[1, 64], help="world counts (1024 takes long on CPU)")
    ap.add_argument("--semi-dt", type=float, nargs="+", default=[5e-4, 1.5e-3],
                    help="SemiImplicit steps [s] (0.5 ms: the issue's; 1.5 ms: bench_engine.py's largest stable)")
    ap.add_argument("--semi-steps", type=int, default=400, help="SemiImplicit steps timed (then extrapolated)")
    ap.add_argument("--semi-worlds", type=int, nargs="*", default=None,
                    help="world counts for SemiImplicit (default: those of --worlds up to 64)")
    ap.add_argument("--launches", action="store_true",
                    help="also time Ostrich without recorded replays (Simulation(graphs=False)) and print the ratio")
    ap.add_argument("--threads", type=int, default=1,
                    help="also time Ostrich with the worlds split across this many threads (CPU; 1: not)")
    ap.add_argument("--checkpoint-every", type=int, default=None, metavar="K",
                    help="also time Ostrich with Simulation(checkpoint_every=K) (segments recomputed backward)")
    ap.add_argument("--device", default="cpu", help="warp device: cpu (default) or cuda[:N]")
    ap.add_argument("--set", nargs="*", default=[], help="SolverOptions fields for Ostrich, name=value "
                    "(e.g. linear_solver=direct)")
    args = ap.parse_args(argv)
    DEVICE = args.device
    OPTIONS.clear()
    OPTIONS.update(option_overrides(args.set))
    if args.set:
        print(f"Ostrich options: {' '.join(args.set)}", flush=True)
    print(f"device: {wp.get_device(DEVICE)}", flush=True)
    semi_worlds = args.semi_worlds if args.semi_worlds is not None else [w for w in args.worlds if w <= 64]
    rows = []
    for w in args.worlds:
        o = run_ostrich(w)
        launched = run_ostrich(w, graphs=False) if args.launches else None
        ck = run_ostrich(w, checkpoint_every=args.checkpoint_every) if args.checkpoint_every else None
        print(f"[{w} worlds] Ostrich fwd {o['forward_s']:.3f} s + bwd {o['backward_s']:.3f} s = {o['total_s']:.3f} s "
              f"({o['replays']} replays); system size n mean {o['gmres_mean']:.1f} max {o['gmres_max']}; "
              f"memory {o['memory_mib']:.2f} MiB; x_final {o['x_final_min']:.2f} m, peak z {o['z_peak_min']:.3f} m",
              flush=True)
        if args.threads > 1 and w > 1:
            th = run_ostrich_threads(w, args.threads)
            o["threaded_s"] = th["total_s"]
            same = bool(np.array_equal(th["grad"], o["grad"]))
            print(f"[{w} worlds] Ostrich on {th['threads']} threads: fwd + bwd {th['total_s']:.3f} s "
                  f"({o['total_s'] / th['total_s']:.2f}x one thread); gradients identical: {same}", flush=True)
        if ck is not None:
            same = bool(np.array_equal(ck["grad"], o["grad"]))
            print(f"[{w} worlds] Ostrich checkpointed every {args.checkpoint_every} steps: fwd {ck['forward_s']:.3f} s "
                  f"+ bwd {ck['backward_s']:.3f} s = {ck['total_s']:.3f} s ({ck['total_s'] / o['total_s']:.2f}x the "
                  f"records'); memory {ck['memory_mib']:.2f} MiB; gradients identical: {same}", flush=True)
        if launched is not None:
            same = bool(np.array_equal(launched["grad"], o["grad"]))
            speed = launched["total_s"] / o["total_s"]
            print(f"[{w} worlds] Ostrich without replays: fwd {launched['forward_s']:.3f} s + bwd "
                  f"{launched['backward_s']:.3f} s = {launched['total_s']:.3f} s; replays {speed:.1f}x "
                  f"faster; gradients identical: {same}", flush=True)
        for dt in args.semi_dt if w in semi_worlds else []:
            s = run_semi(w, dt, args.semi_steps)
            thr = (f"; {s['total_s'] / o['threaded_s']:.1f} with Ostrich on {args.threads} threads"
                   if "threaded_s" in o else "")
            print(f"[{w} worlds] SemiImplicit dt={dt:g} + wp.Tape: {s['timed_steps']} of {s['steps']} steps "
                  f"timed, extrapolated fwd {s['forward_s']:.2f} s + bwd {s['backward_s']:.2f} s = "
                  f"{s['total_s']:.2f} s; ratio SemiImplicit/Ostrich {s['total_s'] / o['total_s']:.1f}{thr}",
                  flush=True)
            rows.append({"ostrich": o, "semi": s, "dt": dt, "launched": launched})
        if w not in semi_worlds:
            rows.append({"ostrich": o, "semi": None, "dt": None, "launched": launched})
    print("\n| worlds | Ostrich fwd [s] | Ostrich bwd [s] | Ostrich fwd+bwd [s] | without replays [s] | system size n "
          "(mean/max) | SemiImplicit dt | SemiImplicit+Tape fwd+bwd [s] (extrapolated) | ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        o, s, la = r["ostrich"], r["semi"], r["launched"]
        st = f"{s['total_s']:.1f} ({s['timed_steps']}/{s['steps']} steps timed)" if s else "-"
        ratio = f"{s['total_s'] / o['total_s']:.1f}x" if s else "-"
        dt = f"{r['dt'] * 1e3:g} ms" if s else "-"
        lt = f"{la['total_s']:.3f} ({la['total_s'] / o['total_s']:.1f}x)" if la else "-"
        print(f"| {o['worlds']} | {o['forward_s']:.3f} | {o['backward_s']:.3f} | {o['total_s']:.3f} | {lt} | "
              f"{o['gmres_mean']:.1f}/{o['gmres_max']} | {dt} | {st} | {ratio} |")
    return rows


if __name__ == "__main__":
    main()
