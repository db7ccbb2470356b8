"""Controller manager (not implemented yet; see issue 5).

Will run sharded controllers from a config file, with the enforced
lock -> wait -> active handover. Nothing here works yet: the package only
reserves its place in the dependency layout.
"""
