-- name: session
-- Who serves this statement: the backend's pid, the port the backend listens on, and
-- the client port the backend sees. Directly connected, that client port is this
-- process's own socket; through a pooler or proxy it is the middleman's.
SELECT pg_backend_pid() AS pid,
       inet_server_port() AS server_port,
       (SELECT client_port FROM pg_stat_activity WHERE pid = pg_backend_pid()) AS client_port;
