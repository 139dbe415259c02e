"""The console: a web page to see and run the cluster, behind a login (docs/console.md).

- credentials.py: who may log in (only KAFSCALE_UI_USERNAME / KAFSCALE_UI_PASSWORD, no defaults);
- sessions.py: sessions, their CSRF tokens, and the slowing down of failed logins;
- view.py: what the pages show, as typed results, and the one interface the API reads the cluster through;
- kafka_view.py: that interface over Kafka's own admin, consumer and producer clients, as one principal, so
  the cluster's ACLs apply to the console as to any client;
- api.py: the HTTP API and the static page; server.py: the HTTP(S) server that serves them.
"""
