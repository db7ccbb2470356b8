"""Built-in sharded controllers: ReplicaSet (owns Pods) and Deployment (owns ReplicaSets).

Built-ins are found by their bare name in the one list
``controller_manager.config.common.BUILTIN_CONTROLLERS`` (name ->
``module:Class``, so the config and its docs name them without importing the
framework). Controllers of your own need no entry there: name them with ``class: "module:Class"`` or an entry point of
the group ``rangeshard.controllers`` (``controller_manager.plugins``).

Modules: ``replicaset`` (the ReplicaSet controller: replicas, adoption,
status), ``deployment`` (the Deployment controller: one ReplicaSet per pod
template, RollingUpdate or Recreate), ``rollout`` (its arithmetic: strategy
bounds, scale steps, revisions, status), ``common`` (label selectors, pod
readiness), ``events`` (an asynchronous Event recorder).
"""

from controller_manager.controllers.deployment import DeploymentController
from controller_manager.controllers.replicaset import ReplicaSetController

__all__ = ["DeploymentController", "ReplicaSetController"]
