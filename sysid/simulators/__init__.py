"""Simulators behind one protocol (`protocol.Simulator`) and a registry of named factories: the engine
(`ostrich`), the kinematic skid-steer baseline (`kinematic`) and MuJoCo (`mujoco`), plus the odometry
observation model they share (`observation`)."""
