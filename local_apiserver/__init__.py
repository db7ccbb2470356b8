"""Local Kubernetes-compatible API server on etcd (not implemented yet; see issue 3).

Nothing here works yet: the package only reserves its place in the dependency
layout.
"""
