"""The `headway` command line and the tooling both machines of a deployment use: launching
and stopping Flower's SuperLink and SuperNodes (:mod:`headway.deploy`, :mod:`headway.processes`),
TLS certificates and SuperNode keys (:mod:`headway.credentials`), and per-node data folders
(:mod:`headway.split`). Nothing that runs inside the FAB (the ServerApp, the ClientApp) imports it.
"""
