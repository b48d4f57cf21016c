"""The server's defaults that ``elmo-fast serve --help`` shows, in one place that needs none of the
``[serve]`` extra's packages (the CLI reads them before knowing whether the extra is installed)."""

#: open sockets (text-embeddings-inference's --max-concurrent-requests default)
MAX_CONNECTIONS = 512
#: sentences (texts, inputs) one request may hold (--max-client-batch-size)
MAX_CLIENT_BATCH_SIZE = 1024
#: tokens one request may hold (--max-request-tokens)
MAX_REQUEST_TOKENS = 8192
#: seconds for a request's head, and then for its body, in all (--read-timeout)
READ_TIMEOUT = 30.0
#: seconds an idle connection is kept after an answer (--keep-alive-timeout)
KEEP_ALIVE_TIMEOUT = 5.0
