"""Robot descriptions: the one reader of ``robot.yaml`` and of URDF + wheel map (`urdf`)."""
