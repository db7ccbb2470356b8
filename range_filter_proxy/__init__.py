"""Range filter proxy (not implemented yet; see issue 4).

Will speak the Kubernetes REST API, apply KEP-5866 ``shardSelector`` filters with
rangeshard's owner-aware path, and serve every downstream list/watch from one
shared upstream watch per resource. Nothing here works yet: the package only
reserves its place in the dependency layout.
"""
