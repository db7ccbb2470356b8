"""The foundation floor: infrastructure every component of rangeshard may use.

Owns
    * :mod:`rangeshard.core.errors` - the project's one error tree.
    * :mod:`rangeshard.core.etcd` - the etcd client (``EtcdClient``: member
      failover, our transaction type, prefix watches), its configuration
      (``EtcdConfig``: the one endpoint grammar, TLS, auth) and the
      translation of gRPC/etcd failures into the error tree; the only
      package that imports pyetcd or grpc.
    * :mod:`rangeshard.core.process` - child-process management
      (``ManagedProcess``, ``popen``, ``free_port``, ``terminate``, and
      ``wait_ready``: the one readiness routine of our children).
    * :mod:`rangeshard.core.etcdserver` - the embedded etcd (``EtcdServer``:
      TLS, auth; a multi-member ``EtcdCluster``), a child process of ours.
    * :mod:`rangeshard.core.serving` - running an ASGI app under uvicorn so
      open streams end as soon as SIGINT/SIGTERM begins the shutdown.
    * :mod:`rangeshard.core.listoptions` - list/watch query parameters,
      parsed and validated once, as kube-apiserver does.
    * :mod:`rangeshard.core.tables` - server-side printing (``meta.k8s.io``
      Tables).
    * :mod:`rangeshard.core.events` - the one builder of Event bodies.
    * :mod:`rangeshard.core.ownertoken` - owner tokens in a manager's
      User-Agent, and the shard rule a write declares.
    * :mod:`rangeshard.core.entrypoint` - ``python -m`` entry points work from
      a directory that shadows our packages (re-run with ``-P``).
    * :mod:`rangeshard.core.settings` - component settings as pydantic
      models: the shared field types (port, key prefix, API URL, etcd
      endpoints, resource names) and the flag reader of the servers' commands.
    * :mod:`rangeshard.core.policy` - the one static authorization policy
      (local API server and the proxy's ``static`` mode).
    * :mod:`rangeshard.core.protobuf_wire` - the Kubernetes protobuf wire
      format and the ``k8s\\0`` envelope; :mod:`rangeshard.core.protobuf` -
      write bodies of any media type read as far as their metadata, for the
      write fence.
    * :mod:`rangeshard.core.protobuf_decode` - whole protobuf objects of the
      built-in kinds as the JSON Go writes for them (the local API server).
    * :mod:`rangeshard.core.protobuf_schema` - the decoder's table: Kubernetes'
      field numbers and Go shapes of each message.
    * :mod:`rangeshard.core.clock` - the injectable monotonic clock.
    * :mod:`rangeshard.core.backoff` - the one retry policy (``Backoff``:
      exponential, jittered, reset after a long enough success) of every
      retry loop.
    * :mod:`rangeshard.core.reflector` - the one reflector, sans I/O
      (``Reflector``: paged list, watch from its resourceVersion, relist on
      410, backoff on failures), driven by the proxy's watch caches and the
      manager's informers.
    * :mod:`rangeshard.core.options` - command-line options the commands
      share (etcd TLS/credentials, serving).
    * :mod:`rangeshard.core.ports` - is a port free, and who holds it.
    * :mod:`rangeshard.core.help_format` - ``--help`` shows flags as flags.
    * :mod:`rangeshard.core.logs` - the one logging setup of every entry point.
    * :mod:`rangeshard.core.loops` - named background threads and tasks that
      log their unexpected end.
    * :mod:`rangeshard.core.timestamps` - RFC 3339 ``Time``/``MicroTime``,
      written and read in one place.
    * :mod:`rangeshard.core.kubeapi` - Kubernetes API helpers shared by the
      two HTTP servers: ``ApiError``/``Status`` bodies, token files,
      ``UserInfo``, the static-token authenticator and kube's 401/403, the
      request-body limit, the lines of a watch stream (``event_line``).
    * :mod:`rangeshard.core.relay` - the relay rules of the proxy's
      pass-through and the external endpoint, sans I/O: which headers pass
      (``HOP_BY_HOP``, ``json_accept``, ``Authorization``), which writes
      carry the owner token, the shard-rule declaration.
    * :mod:`rangeshard.core.http1` - the one HTTP/1.1 layer, sans I/O: heads,
      chunks, the bounded line splitter (``MAX_LINE_BYTES``);
      :mod:`rangeshard.core.http1client` its keep-alive client pool (never a
      write twice) and :mod:`rangeshard.core.http1server` its server.
    * :mod:`rangeshard.core.tokenfile` - the one reader of a bearer token
      file (re-read when rotated, the last good token kept).
    * :mod:`rangeshard.core.selectors` - the one label/field selector parser,
      parameterised by which fields a caller allows.
    * :mod:`rangeshard.core.fieldlabels` - the field labels kube-apiserver
      supports per built-in kind and how each value is read (the local API
      server and the proxy use the one table).
    * :mod:`rangeshard.core.rest` - resource identity (``GVR``) and the one
      parser of REST request paths and kubectl-style resource names.
    * :mod:`rangeshard.core.objpath` - the one walker of dotted paths through
      decoded JSON objects (``get_path``, ``set_path``, ``dig``).
    * :mod:`rangeshard.core.requestinfo` - the one request classifier
      (kube's ``RequestInfo`` verb, resource, subresource, is-write,
      is-watch).

May import
    ``hashing`` and third-party libraries only. Never ``registry``, a
    component (``range_filter_proxy``, ``controller_manager``,
    ``local_apiserver``) or the top floor (``rangeshard.cli``,
    ``rangeshard.dashboard``); import-linter enforces it.

Concurrency model
    Each module states its own; nothing here starts a thread at import time.
"""
