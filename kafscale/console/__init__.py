"""The console: a web page to see and run the cluster, behind a login (docs/console.md).

- credentials.py: who may log in (only KAFSCALE_UI_USERNAME / KAFSCALE_UI_PASSWORD, no defaults);
- sessions.py: sessions and their CSRF tokens (failed logins are slowed by kafscale.security.throttle);
- view.py: what the pages show, as typed results, and the one interface the API reads the cluster through;
- kafka_view.py (with kafka_clients.py, kafka_messages.py, kafka_security.py, answers.py): that interface over
  Kafka's own admin, consumer and producer clients, as one principal, so the cluster's ACLs apply to the
  console as to any client;
- api.py: the login, the guard every request passes, the static page; *_routes.py: one module per page;
  http_io.py: reading requests and writing answers; server.py: the HTTP(S) server that serves them.
"""
