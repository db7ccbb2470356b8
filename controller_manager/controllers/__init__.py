"""Built-in sharded controllers: ReplicaSet (owns Pods) and Deployment (owns ReplicaSets).

Adding a controller is one entry in :data:`CONTROLLERS` (and its name in
``config.KNOWN_CONTROLLERS``).
"""

from controller_manager.controller import Controller
from controller_manager.controllers.deployment import DeploymentController
from controller_manager.controllers.replicaset import ReplicaSetController

CONTROLLERS: dict[str, type[Controller]] = {
    ReplicaSetController.name: ReplicaSetController,
    DeploymentController.name: DeploymentController,
}

__all__ = ["CONTROLLERS", "DeploymentController", "ReplicaSetController"]
