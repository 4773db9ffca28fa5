"""Robot descriptions: the one reader of ``robot.yaml`` and of URDF + wheel map (`description`, `urdf`)."""

from sysid.errors import RobotDescriptionError
from sysid.robot.description import DEFAULT_ROBOT, NOMINALS, load_robot, robot_from_dict, robot_mapping

__all__ = ["DEFAULT_ROBOT", "NOMINALS", "RobotDescriptionError", "load_robot", "robot_from_dict", "robot_mapping"]
