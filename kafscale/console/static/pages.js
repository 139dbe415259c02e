// The console's pages: each builds its forms once and refreshes its data every few seconds (console.js routes to
// them and holds the helpers they use: h, table, api, act, flash, decode, sparkline, confirmDelete).
"use strict";

const pages = {
  overview(main) {
    const body = h("div");
    const rates = {in: [], out: []};
    main.append(h("h1", {}, "Overview"), body);
    return {async refresh() {
      const o = await api("GET", "/api/overview");
      const shards = o.nodes.flatMap(n => n.shards);
      const status = o.shards || {};
      const sum = key => Object.values(status).reduce((t, s) => t + (s[key] || 0), 0);
      rates.in.push(sum("bytes_in_per_s")); rates.out.push(sum("bytes_out_per_s"));
      if (rates.in.length > 60) { rates.in.shift(); rates.out.shift(); }
      const rate = key => (status && Object.keys(status).length) ? `${(sum(key) / 1024).toFixed(1)} KiB/s` : "-";
      body.replaceChildren(
        h("div", {class: "cards"},
          h("div", {class: "card"}, h("b", {"data-testid": "node-count"}, String(o.nodes.length)), "nodes"),
          h("div", {class: "card"}, h("b", {"data-testid": "shard-count"},
            `${shards.filter(s => s.live).length}/${shards.length}`), "shards live"),
          h("div", {class: "card"}, h("b", {}, o.controller ? `pid ${o.controller.pid}` : "-"), "controller"),
          h("div", {class: "card"}, h("b", {}, o.metadata ? String(o.metadata.revision) : "-"),
            "metadata revision"),
          h("div", {class: "card"}, h("b", {"data-testid": "metadata-health"}, o.metadata_store || "-"),
            "metadata store"),
          h("div", {class: "card"}, h("b", {"data-testid": "produce-rate"}, rate("bytes_in_per_s")), "produced"),
          h("div", {class: "card"}, h("b", {}, rate("bytes_out_per_s")), "fetched")),
        h("p", {class: "muted"}, "Bytes produced per second, last refreshes"), sparkline(rates.in, "rate-chart"),
        h("h2", {}, "Shards"),
        table([["shard"], ["node"], ["address"], ["live"], ["S3"], ["busy", "num"], ["connections", "num"],
               ["partitions", "num"], ["groups", "num"], ["Ray"]],
          shards.map(s => {
            const st = status[s.id] || {};
            return [String(s.id), s.node_ip || s.node_id || "-", `${s.host}:${s.port}`,
              s.live ? (s.draining ? "draining" : "yes") : "no", st.s3 || "-",
              st.busy === undefined ? "-" : `${Math.round(st.busy * 100)}%`, String(st.connections ?? "-"),
              String(s.partitions.length), String(s.groups.length), rayLink(st)];
          }), "shards"),
        o.autoscaler && o.autoscaler.last ? h("p", {"data-testid": "autoscaler"},
          `Autoscaler: ${o.autoscaler.last.shards} shards, wants ${o.autoscaler.last.desired}: ` +
          o.autoscaler.last.reason) : "");
    }};
  },

  topics(main) {
    const list = h("div");
    const name = h("input", {name: "name", required: true, "data-testid": "new-topic-name"});
    const parts = h("input", {name: "partitions", type: "number", min: "1", value: "1", "data-testid": "new-topic-partitions"});
    const configs = h("textarea", {name: "configs", rows: "2", placeholder: "cleanup.policy=compact"});
    main.append(h("h1", {}, "Topics"),
      h("form", {class: "inline", "data-testid": "create-topic", onsubmit: e => { e.preventDefault();
        act(`created topic ${name.value}`, () => api("POST", "/api/topics",
          {name: name.value, partitions: Number(parts.value), configs: pairs(configs.value)})); }},
        h("label", {}, "Name", name), h("label", {}, "Partitions", parts), h("label", {}, "Configs", configs),
        h("button", {type: "submit"}, "Create topic")),
      list);
    return {async refresh() {
      const topics = await api("GET", "/api/topics");
      list.replaceChildren(table([["topic"], ["partitions", "num"], ["records", "num"]],
        topics.map(t => [h("a", {href: `#/topics/${encodeURIComponent(t.name)}`}, t.name), String(t.partitions),
                         String(t.records)]), "topics"));
    }};
  },

  topic(main, name) {
    const parts = h("div"), configs = h("div"), msgs = h("div");
    const partition = h("input", {type: "number", min: "0", value: "0", "data-testid": "browse-partition"});
    const from = h("select", {}, h("option", {value: "offset"}, "from offset"),
                   h("option", {value: "timestamp"}, "from timestamp (ms)"));
    const at = h("input", {placeholder: "earliest", "data-testid": "browse-at"});
    const limit = h("input", {type: "number", min: "1", max: "500", value: "50"});
    const decodeAs = h("select", {"data-testid": "decode"}, ["text", "json", "hex"].map(v => h("option", {value: v}, v)));
    let page = null;
    const showMessages = () => {
      if (!page) return;
      const how = decodeAs.value;
      msgs.replaceChildren(h("p", {class: "muted"}, `${page.messages.length} message(s) from offset ${page.start}` +
        ` of partition ${page.partition} (latest ${page.latest})`),
        table([["offset", "num"], ["timestamp"], ["key"], ["value"], ["headers"]],
          page.messages.map(m => [String(m.offset), when(m.timestamp), decode(m.key, how),
            h("div", {}, decode(m.value, how), m.truncated ? h("p", {class: "muted"}, "(cut: longer than 64 KiB)") : ""),
            h("div", {}, m.headers.map(x => h("div", {}, `${x.key}: `, decode(x.value, "text"))))]),
          "messages"));
    };
    const browse = async () => {
      const q = new URLSearchParams({limit: limit.value});
      if (at.value !== "") q.set(from.value, at.value);
      try {
        page = await api("GET", `/api/topics/${encodeURIComponent(name)}/partitions/${partition.value}/messages?${q}`);
        showMessages();
      } catch (e) { flash(e.message, true); }
    };
    decodeAs.addEventListener("change", showMessages);
    const pKey = h("input", {"data-testid": "produce-key"}), pValue = h("textarea", {rows: "2", "data-testid": "produce-value"});
    const pPart = h("input", {type: "number", min: "0", placeholder: "any"}), pHeaders = h("textarea", {rows: "1", placeholder: "k=v"});
    const setName = h("input", {placeholder: "retention.ms"}), setValue = h("input", {});
    main.append(h("h1", {}, `Topic ${name}`), parts,
      h("h2", {}, "Messages"),
      h("form", {class: "inline", "data-testid": "browse", onsubmit: e => { e.preventDefault(); browse(); }},
        h("label", {}, "Partition", partition), h("label", {}, "From", from), h("label", {}, "At", at),
        h("label", {}, "Limit", limit), h("label", {}, "Show as", decodeAs), h("button", {type: "submit"}, "Read")),
      msgs,
      h("h2", {}, "Produce a test message"),
      h("form", {class: "inline", "data-testid": "produce", onsubmit: e => { e.preventDefault();
        act("produced", () => api("POST", `/api/topics/${encodeURIComponent(name)}/messages`, {key: pKey.value || null,
            value: pValue.value, partition: pPart.value === "" ? null : Number(pPart.value), headers: pairs(pHeaders.value)}))
          .then(r => r && flash(`produced to partition ${r.partition} at offset ${r.offset}`)); }},
        h("label", {}, "Key", pKey), h("label", {}, "Value", pValue), h("label", {}, "Partition", pPart),
        h("label", {}, "Headers", pHeaders), h("button", {type: "submit"}, "Produce")),
      h("h2", {}, "Configs"),
      h("form", {class: "inline", onsubmit: e => { e.preventDefault();
        act(`set ${setName.value}`, () => api("PATCH", `/api/topics/${encodeURIComponent(name)}/configs`,
          {set: {[setName.value]: setValue.value}})); }},
        h("label", {}, "Config", setName), h("label", {}, "Value", setValue), h("button", {type: "submit"}, "Set")),
      configs,
      h("h2", {}, "Delete"),
      confirmDelete("topic", name, () => act(`deleted topic ${name}`, async () => {
        await api("DELETE", `/api/topics/${encodeURIComponent(name)}?confirm=${encodeURIComponent(name)}`);
        location.hash = "#/topics";
      })));
    return {async refresh() {
      const t = await api("GET", `/api/topics/${encodeURIComponent(name)}`);
      const known = t.partitions.filter(p => p.size !== null);
      const total = known.length ? known.reduce((sum, p) => sum + p.size, 0) : null;
      const virtual = t.configs.some(c => c.name === "kafscale.virtual.partitions");
      const P = t.physical;
      parts.replaceChildren(
        h("p", {class: "muted"}, "Stored: ", h("b", {"data-testid": "topic-size"}, bytes(total)),
          known.length ? "" : " (sizes need DESCRIBE on the cluster, and kafscale serve's controller)"),
        virtual ? h("p", {"data-testid": "virtual-layout"}, P
          ? `Virtual partitions: ${t.partitions.length} over ${P} physical; partition v is stored in physical ` +
            `partition v % ${P}, which moves with all of its virtual partitions.`
          : `Virtual partitions: ${t.partitions.length} (the physical layout is known to kafscale serve's controller).`)
          : "",
        table([["partition", "num"], ...(P ? [["physical", "num"]] : []), ["leader", "num"], ["earliest", "num"],
               ["latest", "num"], ["size", "num"]],
          t.partitions.map(p => [String(p.partition), ...(P ? [String(p.partition % P)] : []), String(p.leader),
                                 num(p.earliest), num(p.latest), bytes(p.size)]),
          "partitions"));
      configs.replaceChildren(table([["config"], ["value"], ["source"]],
        t.configs.map(c => [c.name, c.sensitive ? "(sensitive)" : (c.value ?? ""), c.source]), "configs"));
    }};
  },

  groups(main) {
    const list = h("div");
    main.append(h("h1", {}, "Consumer groups"), list);
    return {async refresh() {
      const groups = await api("GET", "/api/groups");
      list.replaceChildren(groups.length ? table([["group"], ["state"], ["type"], ["members", "num"]],
        groups.map(g => [h("a", {href: `#/groups/${encodeURIComponent(g.group_id)}`}, g.group_id), g.state, g.type,
                         String(g.members)]), "groups") : h("p", {class: "muted"}, "no groups"));
    }};
  },

  group(main, id) {
    const info = h("div"), members = h("div"), offsets = h("div"), chart = h("div");
    const lags = [];
    const topic = h("input", {required: true, "data-testid": "reset-topic"});
    const to = h("select", {"data-testid": "reset-to"}, ["earliest", "latest", "offset", "timestamp"].map(v => h("option", {value: v}, v)));
    const value = h("input", {placeholder: "offset or timestamp (ms)"});
    main.append(h("h1", {}, `Group ${id}`), info, chart, h("h2", {}, "Members"), members,
      h("h2", {}, "Committed offsets and lag"), offsets,
      h("h2", {}, "Reset offsets"), h("p", {class: "muted"}, "Only an empty group's offsets can be reset (stop its consumers first)."),
      h("form", {class: "inline", "data-testid": "reset", onsubmit: e => { e.preventDefault();
        act(`reset offsets of ${id} on ${topic.value}`, () => api("POST", `/api/groups/${encodeURIComponent(id)}/reset-offsets`,
          {topic: topic.value, to: to.value, value: value.value === "" ? null : Number(value.value)})); }},
        h("label", {}, "Topic", topic), h("label", {}, "To", to), h("label", {}, "Value", value),
        h("button", {type: "submit"}, "Reset")),
      h("h2", {}, "Delete"),
      confirmDelete("group", id, () => act(`deleted group ${id}`, async () => {
        await api("DELETE", `/api/groups/${encodeURIComponent(id)}?confirm=${encodeURIComponent(id)}`);
        location.hash = "#/groups";
      })));
    return {async refresh() {
      const g = await api("GET", `/api/groups/${encodeURIComponent(id)}`);
      lags.push(g.total_lag); if (lags.length > 60) lags.shift();
      info.replaceChildren(h("p", {"data-testid": "group-state"},
        `${g.state} · ${g.type} · ${g.protocol || "no assignor"} · coordinator ${g.coordinator} · total lag `,
        h("b", {"data-testid": "total-lag"}, String(g.total_lag))));
      chart.replaceChildren(h("p", {class: "muted"}, "Total lag, last refreshes"), sparkline(lags, "lag-chart"));
      members.replaceChildren(g.members.length ? table([["member"], ["client"], ["host"], ["assignment"]],
        g.members.map(m => [m.member_id, m.client_id, m.host, m.assignment.join(", ")]), "members")
        : h("p", {class: "muted"}, "no members"));
      offsets.replaceChildren(table([["topic"], ["partition", "num"], ["committed", "num"], ["latest", "num"], ["lag", "num"]],
        g.offsets.map(o => [o.topic, String(o.partition), num(o.committed), num(o.latest), num(o.lag)]),
        "offsets"));
    }};
  },

  security(main) {
    const users = h("div"), acls = h("div");
    const uName = h("input", {required: true, "data-testid": "user-name"});
    const uPass = h("input", {type: "password", required: true, "data-testid": "user-password"});
    const uMech = h("select", {}, ["SCRAM-SHA-256", "SCRAM-SHA-512"].map(v => h("option", {value: v}, v)));
    const field = (name, testid, value) => h("input", {name, "data-testid": testid, value: value || ""});
    const pick = (name, values) => h("select", {name}, values.map(v => h("option", {value: v}, v)));
    const acl = {resource_type: pick("resource_type", ["TOPIC", "GROUP", "CLUSTER", "TRANSACTIONAL_ID"]),
                 resource_name: field("resource_name", "acl-resource"), pattern_type: pick("pattern_type", ["LITERAL", "PREFIXED"]),
                 principal: field("principal", "acl-principal", "User:"), host: field("host", "acl-host", "*"),
                 operation: pick("operation", ["READ", "WRITE", "CREATE", "DELETE", "ALTER", "DESCRIBE", "DESCRIBE_CONFIGS",
                                               "ALTER_CONFIGS", "IDEMPOTENT_WRITE", "CLUSTER_ACTION", "ALL"]),
                 permission: pick("permission", ["ALLOW", "DENY"])};
    const aclBody = () => Object.fromEntries(Object.entries(acl).map(([k, el]) => [k, el.value]));
    main.append(h("h1", {}, "Security"),
      h("h2", {}, "Users (SCRAM)"), users,
      h("form", {class: "inline", "data-testid": "add-user", onsubmit: e => { e.preventDefault();
        act(`set the password of ${uName.value}`, () => api("POST", "/api/users",
          {name: uName.value, password: uPass.value, mechanism: uMech.value})).then(() => { uPass.value = ""; }); }},
        h("label", {}, "User", uName), h("label", {}, "Password", uPass), h("label", {}, "Mechanism", uMech),
        h("button", {type: "submit"}, "Add or set password")),
      h("h2", {}, "ACLs"), acls,
      h("form", {class: "inline", "data-testid": "add-acl", onsubmit: e => { e.preventDefault();
        act("created the ACL", () => api("POST", "/api/acls", aclBody())); }},
        Object.entries(acl).map(([k, el]) => h("label", {}, k.replace("_", " "), el)),
        h("button", {type: "submit"}, "Add ACL")));
    return {async refresh() {
      const [us, as] = await Promise.all([api("GET", "/api/users"), api("GET", "/api/acls")]);
      const rows = us.flatMap(u => u.credentials.map(c => [u.name, `${c.mechanism} (${c.iterations} iterations)`,
        h("button", {class: "danger", onclick: () => {
          if (window.confirm(`Delete the ${c.mechanism} credential of ${u.name}?`))
            act(`deleted ${c.mechanism} of ${u.name}`, () => api("DELETE", `/api/users/${encodeURIComponent(u.name)}?` +
              new URLSearchParams({confirm: u.name, mechanism: c.mechanism})));
        }}, "Delete")]));
      users.replaceChildren(rows.length ? table([["user"], ["credential"], [""]], rows, "users") : h("p", {class: "muted"}, "no users"));
      acls.replaceChildren(as.length ? table([["resource"], ["pattern"], ["principal"], ["host"], ["operation"], ["permission"], [""]],
        as.map(a => [`${a.resource_type}:${a.resource_name}`, a.pattern_type, a.principal, a.host, a.operation, a.permission,
          h("button", {class: "danger", onclick: () => {
            if (window.confirm(`Remove ${a.permission} ${a.operation} on ${a.resource_type}:${a.resource_name} for ${a.principal}?`))
              act("removed the ACL", () => api("POST", `/api/acls/delete?${new URLSearchParams({confirm: a.principal})}`, a));
          }}, "Remove")]), "acls") : h("p", {class: "muted"}, "no ACLs"));
    }};
  },

  placement(main) {
    const layout = h("div");
    const topic = h("input", {required: true, "data-testid": "move-topic"});
    const partition = h("input", {type: "number", min: "0", value: "0", "data-testid": "move-partition"});
    const shard = h("input", {type: "number", min: "0", required: true, "data-testid": "move-shard"});
    const node = h("input", {required: true, placeholder: "node IP or id prefix", "data-testid": "drain-node"});
    main.append(h("h1", {}, "Placement"), layout,
      h("h2", {}, "Move a partition"),
      h("form", {class: "inline", "data-testid": "move", onsubmit: e => { e.preventDefault();
        act(`moved ${topic.value}-${partition.value} to shard ${shard.value}`, () => api("POST", "/api/placement/move",
          {topic: topic.value, partition: Number(partition.value), shard: Number(shard.value)})); }},
        h("label", {}, "Topic", topic), h("label", {}, "Partition", partition), h("label", {}, "To shard", shard),
        h("button", {type: "submit"}, "Move")),
      h("h2", {}, "Drain a node"),
      h("form", {class: "inline", "data-testid": "drain", onsubmit: e => { e.preventDefault();
        if (window.confirm(`Move everything off the shards of ${node.value}?`))
          act(`drained ${node.value}`, () => api("POST", "/api/placement/drain", {node: node.value})); }},
        h("label", {}, "Node", node), h("button", {class: "danger", type: "submit"}, "Drain")));
    return {async refresh() {
      const o = await api("GET", "/api/overview");
      layout.replaceChildren(table([["node"], ["shard"], ["live"], ["leads partitions"], ["coordinates groups"]],
        o.nodes.flatMap(n => n.shards.map(s => [n.node_ip || n.node_id, String(s.id),
          s.live ? (s.draining ? "draining" : "yes") : "no", s.partitions.join(", "), s.groups.join(", ")])),
        "placement"));
    }};
  },
};
