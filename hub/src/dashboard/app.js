// Drover's dashboard script: forms post to the API, lists follow the API's watch and redraw
// their rows from the hub's own rendering, and a few conveniences (filter, sort, ages, copy).
"use strict";

// A page that draws a terminal: xterm writes its dimensions and theme into <style> elements
// it makes as it draws, and the page's policy applies only those that carry the page's nonce,
// so every one made on the page does. Only the hub's own scripts run (script-src 'self').
(() => {
  const nonce = document.querySelector('meta[name="style-nonce"]');
  if (!nonce) return;
  const create = Document.prototype.createElement;
  Document.prototype.createElement = function (tag, options) {
    const made = create.call(this, tag, options);
    if (String(tag).toLowerCase() === "style") made.nonce = nonce.content;
    return made;
  };
})();

async function apiCall(method, path, body) {
  const response = await fetch(path, {
    method,
    headers: body === undefined ? {} : { "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  let data = null;
  try {
    data = await response.json();
  } catch (_) {
    data = null;
  }
  return { ok: response.ok, status: response.status, data };
}

function showError(id, result) {
  const el = document.getElementById(id);
  if (!el) return;
  const message = result.data && result.data.message;
  el.textContent = message || `The hub answered ${result.status}.`;
}

function setupLogin() {
  const form = document.getElementById("login");
  if (!form) return;
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const result = await apiCall("POST", "/v1/login", {
      username: form.username.value,
      password: form.password.value,
      // The directory chosen on the login page; the hub's own users if none is offered.
      provider: form.provider ? form.provider.value : "local",
      session: true,
    });
    if (result.ok) {
      // The hub checked `next` (api::next_path) before it wrote it into the page; a value
      // that would leave this origin anyway is not followed.
      const next = new URL(form.dataset.next || "/clusters", window.location.origin);
      window.location.assign(next.origin === window.location.origin ? next.href : "/clusters");
    } else {
      showError("login-error", result);
    }
  });
}

function setupLogout() {
  const button = document.getElementById("logout");
  if (!button) return;
  button.addEventListener("click", async () => {
    const result = await apiCall("POST", "/v1/logout");
    // A user of an OpenID provider signs out there too, which sends them back to /login.
    const endSession = result.data && result.data.endSession;
    window.location.assign(endSession || "/login");
  });
}

// "3m", "5h", "2d" since an RFC 3339 time.
function age(text) {
  const then = Date.parse(text);
  if (Number.isNaN(then)) return text;
  const seconds = Math.max(0, Math.round((Date.now() - then) / 1000));
  if (seconds < 60) return `${seconds}s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)}m`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)}h`;
  return `${Math.floor(seconds / 86400)}d`;
}

function showAges(root) {
  for (const time of root.querySelectorAll("time[datetime]")) {
    time.textContent = age(time.getAttribute("datetime"));
    time.title = time.getAttribute("datetime");
  }
}

function applyFilter(table) {
  const input = document.getElementById("filter");
  const words = input ? input.value.trim().toLowerCase() : "";
  for (const row of table.tBodies[0].rows) {
    row.hidden = words !== "" && !row.textContent.toLowerCase().includes(words);
  }
}

function applySort(table) {
  const column = table.dataset.sortColumn;
  if (column === undefined) return;
  const direction = table.dataset.sortDirection === "descending" ? -1 : 1;
  const body = table.tBodies[0];
  const key = (row) => {
    const cell = row.cells[Number(column)];
    if (!cell) return "";
    const time = cell.querySelector("time[datetime]");
    return time ? time.getAttribute("datetime") : cell.textContent.trim();
  };
  const rows = Array.from(body.rows);
  rows.sort((a, b) => direction * key(a).localeCompare(key(b)));
  for (const row of rows) body.appendChild(row);
}

function setupSorting(table) {
  for (const button of table.querySelectorAll("button.sort")) {
    button.addEventListener("click", () => {
      const column = button.dataset.sort;
      const same = table.dataset.sortColumn === column;
      const direction = same && table.dataset.sortDirection === "ascending" ? "descending" : "ascending";
      table.dataset.sortColumn = column;
      table.dataset.sortDirection = direction;
      for (const th of table.tHead.rows[0].cells) th.removeAttribute("aria-sort");
      button.closest("th").setAttribute("aria-sort", direction);
      applySort(table);
    });
  }
}

// Keeps a table's rows current: redraws them from `data-rows` (rendered by the hub) when the
// API's watch at `data-watch` reports a change, and every `data-poll` seconds for what lives
// in the hub's memory (heartbeats, usage). With `data-only`, only that row is kept.
function follow(table) {
  let pending = null;
  const redraw = async () => {
    pending = null;
    const response = await fetch(table.dataset.rows, { cache: "no-store" });
    // The session ended: log in again, then come back here.
    if (response.redirected && new URL(response.url).pathname === "/login") {
      window.location.assign(`/login?next=${encodeURIComponent(window.location.pathname)}`);
      return;
    }
    if (!response.ok) return;
    const html = await response.text();
    const body = table.tBodies[0];
    const only = table.dataset.only;
    if (only) {
      const holder = document.createElement("tbody");
      holder.innerHTML = html;
      const row = Array.from(holder.rows).find((r) => r.dataset.name === only);
      if (row) body.replaceChildren(row);
    } else {
      body.innerHTML = html;
      const empty = document.getElementById("no-rows");
      if (empty) empty.hidden = body.rows.length > 0;
    }
    showAges(body);
    applyFilter(table);
    applySort(table);
  };
  const changed = () => {
    if (pending === null) pending = setTimeout(redraw, 100);
  };
  const open = () => {
    const source = new EventSource(table.dataset.watch);
    for (const name of ["ADDED", "MODIFIED", "DELETED"]) {
      source.addEventListener(name, changed);
    }
    // Fell behind: start again from the current state.
    source.addEventListener("ERROR", () => {
      source.close();
      changed();
      setTimeout(open, 1000);
    });
  };
  if (table.dataset.watch) open();
  if (table.dataset.poll) setInterval(changed, Number(table.dataset.poll) * 1000);
}

function setupTables() {
  for (const table of document.querySelectorAll("table[data-rows]")) {
    setupSorting(table);
    follow(table);
    const input = document.getElementById("filter");
    if (input) input.addEventListener("input", () => applyFilter(table));
  }
  showAges(document);
}

// A fleet list (clusters, hosts) the hub filters, sorts and pages: the view is the page's
// address. Changing a filter, a sort or the page asks the hub for that view's section once
// and puts the view in the address; the API's watch redraws the section only when it names a
// row shown or something comes or goes (a row's state on another page is not this page's to
// follow); `data-poll` redraws it for what lives in the hub's memory (agents, usage).
function setupFleet() {
  const section = document.getElementById("fleet");
  const form = document.getElementById("filters");
  if (!section) return;
  const path = window.location.pathname;
  let pending = null;
  let asked = 0;
  const redraw = async () => {
    pending = null;
    const ask = ++asked;
    const response = await fetch(section.dataset.rows, { cache: "no-store" });
    if (response.redirected && new URL(response.url).pathname === "/login") {
      window.location.assign(`/login?next=${encodeURIComponent(window.location.pathname + window.location.search)}`);
      return;
    }
    // An answer to a view asked for before the one shown now is not drawn over it.
    if (!response.ok || ask !== asked) return;
    section.innerHTML = await response.text();
    showAges(section);
  };
  const changed = () => {
    if (pending === null) pending = setTimeout(redraw, 100);
  };
  const show = (query) => {
    // The form carries the order into the next filter it sends.
    if (form) {
      let sort = form.querySelector("input[name=sort]");
      if (!sort) {
        sort = document.createElement("input");
        sort.type = "hidden";
        sort.name = "sort";
        form.append(sort);
      }
      sort.value = query.get("sort") || "";
    }
    const view = query.toString();
    window.history.replaceState(null, "", view ? `${path}?${view}` : path);
    section.dataset.rows = `${path}?part=rows${view ? `&${view}` : ""}`;
    clearTimeout(pending);
    pending = null;
    redraw();
  };
  const fromForm = () => {
    const query = new URLSearchParams();
    for (const [key, value] of new FormData(form)) {
      if (String(value).trim() !== "") query.set(key, String(value).trim());
    }
    return query;
  };
  if (form) {
    let typing = null;
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      show(fromForm());
    });
    form.addEventListener("change", (event) => {
      if (event.target.tagName === "SELECT") show(fromForm());
    });
    form.addEventListener("input", (event) => {
      if (event.target.tagName !== "INPUT") return;
      clearTimeout(typing);
      typing = setTimeout(() => show(fromForm()), 250);
    });
  }
  // Sort headings and page links: the same view, another order or page.
  section.addEventListener("click", (event) => {
    const link = event.target.closest("a.view");
    if (!link) return;
    event.preventDefault();
    show(new URL(link.href).searchParams);
  });
  const shown = (name) => Array.from(section.querySelectorAll("tr[data-name]")).some((row) => row.dataset.name === name);
  const open = () => {
    const source = new EventSource(section.dataset.watch);
    const onEvent = (message) => {
      if (message.type === "MODIFIED") {
        let name = null;
        try {
          name = JSON.parse(message.data).object.metadata.name;
        } catch (_) {
          name = null;
        }
        if (name !== null && !shown(name)) return;
      }
      changed();
    };
    for (const name of ["ADDED", "MODIFIED", "DELETED"]) source.addEventListener(name, onEvent);
    source.addEventListener("ERROR", () => {
      source.close();
      changed();
      setTimeout(open, 1000);
    });
  };
  if (section.dataset.watch) open();
  if (section.dataset.poll) setInterval(changed, Number(section.dataset.poll) * 1000);
}

// The cluster page's events: those kept, then each new one, newest first.
function setupEvents() {
  const list = document.getElementById("events");
  if (!list) return;
  const source = new EventSource(list.dataset.events);
  source.addEventListener("EVENT", (message) => {
    const event = JSON.parse(message.data);
    const item = document.createElement("li");
    item.className = event.type === "Warning" ? "warning" : "normal";
    const time = document.createElement("time");
    time.setAttribute("datetime", event.time);
    time.textContent = event.time.replace("T", " ").replace("Z", "");
    const reason = document.createElement("strong");
    reason.textContent = event.reason;
    const text = document.createElement("span");
    text.textContent = event.message;
    item.append(time, " ", reason, " ", text);
    item.dataset.reason = event.reason;
    list.prepend(item);
    while (list.children.length > 200) list.lastElementChild.remove();
  });
}

// A kubeconfig the hub writes (with a new token of the user's) saved as a file: a cluster's,
// or the hub's own for kubectl to manage the hub's objects.
function offerKubeconfig(button, url, file, errorId) {
  button.addEventListener("click", async () => {
    const response = await fetch(url, { method: "POST" });
    if (!response.ok) {
      showError(errorId, { status: response.status, data: await response.json().catch(() => null) });
      return;
    }
    const blob = new Blob([await response.text()], { type: "application/yaml" });
    const link = document.createElement("a");
    link.href = URL.createObjectURL(blob);
    link.download = file;
    link.id = `${button.id}-link`;
    link.textContent = "kubeconfig";
    link.hidden = true;
    document.body.append(link);
    link.click();
    button.textContent = "Kubeconfig downloaded";
  });
}

function setupClusterActions() {
  const download = document.getElementById("kubeconfig");
  if (download) {
    const cluster = download.dataset.cluster;
    offerKubeconfig(download, `/v1/clusters/${encodeURIComponent(cluster)}/kubeconfig`, `${cluster}.kubeconfig.yaml`, "kubeconfig-error");
  }
  const hub = document.getElementById("hub-kubeconfig");
  if (hub) offerKubeconfig(hub, "/v1/kubeconfig", "drover-hub.kubeconfig.yaml", "hub-kubeconfig-error");
  // Deleting waits for the hosts to uninstall; removing anyway (hosts gone for good) does not.
  for (const [id, force] of [["delete-cluster", false], ["remove-anyway", true]]) {
    const button = document.getElementById(id);
    if (!button) continue;
    button.addEventListener("click", async () => {
      const { cluster, hosts } = button.dataset;
      const question = force
        ? `Remove cluster ${cluster} without its hosts? These hosts are forgotten and may keep running its distribution: ${hosts}.`
        : `Delete cluster ${cluster}? Its hosts uninstall its distribution, and its agents' credentials are revoked.`;
      if (!window.confirm(question)) return;
      const path = `/v1/clusters/${encodeURIComponent(cluster)}${force ? "?force=true" : ""}`;
      const result = await apiCall("DELETE", path);
      if (result.ok) window.location.reload();
      else showError("delete-cluster-error", result);
    });
  }
  const pause = document.getElementById("pause");
  if (pause) {
    pause.addEventListener("click", async () => {
      const paused = pause.dataset.paused === "true";
      const result = await apiCall("PATCH", `/v1/clusters/${encodeURIComponent(pause.dataset.cluster)}`, { spec: { paused: !paused } });
      if (!result.ok) {
        showError("pause-error", result);
        return;
      }
      window.location.reload();
    });
  }
  // A pool's scale buttons (in rows that redraw: one listener for them all). The cluster is
  // read and written back at its resourceVersion, so a change made meanwhile is refused, not
  // overwritten.
  document.addEventListener("click", async (event) => {
    const button = event.target.closest("button.scale");
    if (!button) return;
    button.disabled = true;
    const path = `/v1/clusters/${encodeURIComponent(button.dataset.cluster)}`;
    const read = await apiCall("GET", path);
    if (!read.ok) {
      showError("pool-error", read);
      return;
    }
    const cluster = read.data;
    const pool = (cluster.spec.machinePools || []).find((p) => p.name === button.dataset.pool);
    if (!pool) return;
    pool.quantity = Math.max(0, pool.quantity + Number(button.dataset.by));
    const written = await apiCall("PUT", path, cluster);
    if (!written.ok) showError("pool-error", written);
    else document.getElementById("pool-error").textContent = "";
  });
  // A hosted cluster's node group resized by one (within its bounds), and its version raised:
  // read and written back at its resourceVersion, as the pools are.
  const changeHosted = async (clusterName, change) => {
    const path = `/v1/clusters/${encodeURIComponent(clusterName)}`;
    const read = await apiCall("GET", path);
    if (!read.ok) {
      showError("hosted-error", read);
      return false;
    }
    const cluster = read.data;
    if (!change(cluster.spec.hosted)) return false;
    const written = await apiCall("PUT", path, cluster);
    if (!written.ok) {
      showError("hosted-error", written);
      return false;
    }
    document.getElementById("hosted-error").textContent = "";
    return true;
  };
  document.addEventListener("click", async (event) => {
    const button = event.target.closest("button.scale-group");
    if (!button) return;
    button.disabled = true;
    await changeHosted(button.dataset.cluster, (hosted) => {
      const group = (hosted.nodeGroups || []).find((g) => g.name === button.dataset.group);
      if (!group) return false;
      const min = group.minSize || 0;
      group.desiredSize = Math.min(group.maxSize, Math.max(min, group.desiredSize + Number(button.dataset.by)));
      return true;
    });
  });
  const upgradeHosted = document.getElementById("upgrade-hosted");
  if (upgradeHosted) {
    upgradeHosted.addEventListener("submit", async (event) => {
      event.preventDefault();
      const version = upgradeHosted.version.value.trim();
      const done = await changeHosted(upgradeHosted.dataset.cluster, (hosted) => {
        hosted.kubernetesVersion = version;
        return true;
      });
      if (done) window.location.reload();
    });
  }
  const addPool = document.getElementById("add-pool");
  if (addPool) {
    addPool.addEventListener("submit", async (event) => {
      event.preventDefault();
      const path = `/v1/clusters/${encodeURIComponent(addPool.dataset.cluster)}`;
      const read = await apiCall("GET", path);
      if (!read.ok) {
        showError("pool-error", read);
        return;
      }
      const cluster = read.data;
      cluster.spec.machinePools = (cluster.spec.machinePools || []).concat([{
        name: addPool.name.value,
        template: addPool.template.value,
        quantity: Number(addPool.quantity.value),
        roles: {
          etcd: addPool.etcd.checked,
          controlPlane: addPool.controlPlane.checked,
          worker: addPool.worker.checked,
        },
      }]);
      const written = await apiCall("PUT", path, cluster);
      if (!written.ok) {
        showError("pool-error", written);
        return;
      }
      window.location.reload();
    });
  }
  const register = document.getElementById("new-registration");
  if (register) {
    register.addEventListener("click", async () => {
      const result = await apiCall("POST", "/v1/registrationtokens", { spec: { cluster: register.dataset.cluster } });
      if (!result.ok) {
        showError("registration-error", result);
        return;
      }
      const r = result.data.registration || {};
      document.getElementById("registration-command").textContent = r.hostCommand || r.importCommand;
      document.getElementById("registration").hidden = false;
    });
  }
}

// The Roles page: a template from the resources and verbs ticked in its table, or from YAML.
function setupTemplateForms() {
  const form = document.getElementById("create-template");
  if (form) {
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      // One rule per resource ticked, with its verbs (`deployments.apps/scale`: resource
      // deployments/scale of group apps).
      const rules = [];
      for (const row of form.querySelectorAll("#template-rules tbody tr")) {
        const verbs = [...row.querySelectorAll("input:checked")].map((i) => i.value);
        if (verbs.length === 0) continue;
        const named = row.querySelector("input").dataset.resource;
        const [resource, sub] = named.split("/");
        const dot = resource.indexOf(".");
        const group = dot < 0 ? "" : resource.slice(dot + 1);
        const name = (dot < 0 ? resource : resource.slice(0, dot)) + (sub ? `/${sub}` : "");
        rules.push({ apiGroups: [group], resources: [name], verbs });
      }
      const inherits = [...form.inherits.selectedOptions].map((o) => o.value);
      const spec = { context: form.context.value, rules };
      if (form.displayName.value.trim()) spec.displayName = form.displayName.value.trim();
      if (inherits.length) spec.inherits = inherits;
      const result = await apiCall("POST", "/v1/roletemplates", { metadata: { name: form.name.value.trim() }, spec });
      if (result.ok) window.location.reload();
      else showError("template-error", result);
    });
  }
  const yaml = document.getElementById("create-template-yaml");
  if (yaml) {
    yaml.addEventListener("submit", async (event) => {
      event.preventDefault();
      const response = await fetch("/v1/roletemplates", {
        method: "POST",
        headers: { "Content-Type": "application/yaml" },
        body: yaml.yaml.value,
      });
      if (response.ok) {
        window.location.reload();
        return;
      }
      let data = null;
      try {
        data = await response.json();
      } catch (_) {
        data = null;
      }
      showError("template-yaml-error", { status: response.status, data });
    });
  }
}

// Forms that create an object through the API, then show the page again.
function setupCreateForms() {
  const forms = {
    "create-user": ["user-error", (f) => ["/v1/users", { metadata: { name: f.name.value.trim() }, spec: { password: f.password.value } }]],
    // The chosen option says which field of the binding names it: a builtin role by name, a
    // role template, or a global role (on the hub, no cluster).
    "create-binding": ["binding-error", (f) => {
      const user = f.user.value.trim();
      const role = f.role.value;
      const option = f.role.selectedOptions[0];
      const global = role === "admin" || option.dataset.global === "true";
      const spec = { user, [option.dataset.field || "role"]: role };
      if (!global) spec.cluster = f.cluster.value;
      const name = `${user}-${role}-${spec.cluster || "global"}`.toLowerCase().replace(/[^a-z0-9-]+/g, "-");
      return ["/v1/rolebindings", { metadata: { name }, spec }];
    }],
    // Named after the cluster and the time (UTC), as `drover-hub cluster snapshot` names it.
    "create-snapshot": ["snapshot-error", (f) => {
      const stamp = new Date().toISOString().replace(/[-:T]/g, "").slice(0, 14);
      const name = f.name.value.trim() || `${f.dataset.cluster.slice(0, 48).replace(/-+$/, "")}-${stamp}`;
      const spec = { cluster: f.dataset.cluster, copyToHub: f.copyToHub.checked };
      return ["/v1/etcdsnapshots", { metadata: { name }, spec }];
    }],
    "create-project": ["project-error", (f) => ["/v1/projects", {
      metadata: { name: f.name.value.trim() },
      spec: { cluster: f.dataset.cluster, displayName: f.displayName.value.trim() },
    }]],
    // Named as `drover-hub project add-member` names it, so either can remove it.
    "create-project-member": ["member-error", (f) => {
      const [project, user] = [f.project.value.trim(), f.user.value.trim()];
      const field = f.role.selectedOptions[0].dataset.field || "role";
      const spec = { user, [field]: f.role.value, cluster: f.dataset.cluster, project };
      return ["/v1/rolebindings", { metadata: { name: `${project}-${user}` }, spec }];
    }],
  };
  for (const [id, [errorId, build]] of Object.entries(forms)) {
    const form = document.getElementById(id);
    if (!form) continue;
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const [path, body] = build(form);
      const result = await apiCall("POST", path, body);
      if (result.ok) window.location.reload();
      else showError(errorId, result);
    });
  }
  setupTemplateForms();
  const token = document.getElementById("create-token");
  if (token) {
    token.addEventListener("submit", async (event) => {
      event.preventDefault();
      const result = await apiCall("POST", "/v1/tokens", { spec: { description: token.description.value.trim() } });
      if (!result.ok) {
        showError("token-error", result);
        return;
      }
      document.getElementById("token-value").textContent = result.data.token;
      document.getElementById("token-created").hidden = false;
      token.hidden = true;
    });
  }
  // The snapshot table's rows are redrawn as snapshots change: one listener on the table.
  const snapshots = document.getElementById("snapshots");
  if (snapshots) {
    snapshots.addEventListener("click", async (event) => {
      const button = event.target.closest("button");
      if (!button) return;
      let result;
      if (button.classList.contains("snapshot-restore")) {
        const { cluster, snapshot, generation } = button.dataset;
        if (!window.confirm(`Restore cluster ${cluster} from ${snapshot}? Its hosts stop while etcd is restored.`)) return;
        result = await apiCall("PATCH", `/v1/clusters/${cluster}`, {
          spec: { restore: { snapshot, generation: Number(generation) } },
        });
      } else if (button.classList.contains("snapshot-delete")) {
        result = await apiCall("DELETE", button.dataset.path);
      } else {
        return;
      }
      if (result.ok) window.location.reload();
      else showError("snapshot-action-error", result);
    });
  }
  for (const button of document.querySelectorAll("button.delete")) {
    button.addEventListener("click", async () => {
      const result = await apiCall("DELETE", button.dataset.path);
      if (result.ok) window.location.reload();
      else window.alert((result.data && result.data.message) || `The hub answered ${result.status}.`);
    });
  }
}

function setupCopy() {
  for (const button of document.querySelectorAll("button.copy")) {
    button.addEventListener("click", async () => {
      const text = document.getElementById(button.dataset.copy).textContent;
      try {
        await navigator.clipboard.writeText(text);
        button.textContent = "Copied";
      } catch (_) {
        // No clipboard access: select the text so Ctrl-C copies it.
        const range = document.createRange();
        range.selectNodeContents(document.getElementById(button.dataset.copy));
        const selection = window.getSelection();
        selection.removeAllRanges();
        selection.addRange(range);
        button.textContent = "Selected: press Ctrl-C";
      }
    });
  }
}

function setupCreateCluster() {
  const form = document.getElementById("create-cluster");
  if (!form) return;
  const custom = document.getElementById("custom-fields");
  const hosted = document.getElementById("hosted-fields");
  const sync = () => {
    custom.hidden = form.type.value !== "custom";
    hosted.hidden = form.type.value !== "hosted";
  };
  for (const radio of form.querySelectorAll('input[name="type"]')) radio.addEventListener("change", sync);
  const distribution = document.getElementById("distribution");
  distribution.addEventListener("change", () => {
    const version = document.getElementById("version");
    version.value = version.value.replace(/\+(k3s|rke2r)1$/, distribution.value === "rke2" ? "+rke2r1" : "+k3s1");
  });
  sync();
  const another = document.getElementById("another-pool");
  if (another) {
    another.addEventListener("click", () => {
      const rows = form.querySelectorAll(".pool-row");
      const row = rows[rows.length - 1].cloneNode(true);
      row.querySelector('input[name="pool-name"]').value = "";
      another.before(row);
      row.querySelector('input[name="pool-name"]').focus();
    });
  }
  const anotherGroup = document.getElementById("another-group");
  anotherGroup.addEventListener("click", () => {
    const rows = form.querySelectorAll(".group-row");
    const row = rows[rows.length - 1].cloneNode(true);
    row.querySelector('input[name="group-name"]').value = "";
    anotherGroup.before(row);
    row.querySelector('input[name="group-name"]').focus();
  });
  // A hosted cluster's spec from its fields; the hub checks it (and names the bad field).
  const hostedSpec = () => {
    const value = (n) => form.querySelector(`#hosted-fields [name="${n}"]`).value.trim();
    const spec = {
      driver: "eks",
      credential: value("credential"),
      region: value("region"),
      kubernetesVersion: value("kubernetesVersion"),
      roleArn: value("roleArn"),
      nodeRole: value("nodeRole"),
      subnets: value("subnets").split(",").map((s) => s.trim()).filter((s) => s !== ""),
      nodeGroups: [...form.querySelectorAll(".group-row")]
        .map((row) => {
          const field = (n) => row.querySelector(`[name="group-${n}"]`).value.trim();
          return {
            name: field("name"),
            instanceType: field("instanceType"),
            desiredSize: Number(field("desiredSize")),
            minSize: Number(field("minSize")),
            maxSize: Number(field("maxSize")),
          };
        })
        .filter((g) => g.name !== ""),
    };
    if (value("endpoint") !== "") spec.endpoint = value("endpoint");
    if (value("endpointCA") !== "") spec.endpointCA = value("endpointCA");
    return spec;
  };
  // The pools whose row has a name; the hub checks the rest (and names the bad field).
  const pools = () => [...form.querySelectorAll(".pool-row")]
    .map((row) => {
      const field = (n) => row.querySelector(`[name="pool-${n}"]`);
      return {
        name: field("name").value.trim(),
        template: field("template").value,
        quantity: Number(field("quantity").value),
        roles: { etcd: field("etcd").checked, controlPlane: field("controlPlane").checked, worker: field("worker").checked },
      };
    })
    .filter((p) => p.name !== "");
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const name = form.name.value.trim();
    const spec = { type: form.type.value };
    if (spec.type === "custom") {
      spec.distribution = form.distribution.value;
      spec.version = form.version.value.trim();
      spec.upgradeStrategy = {
        controlPlaneConcurrency: form.controlPlaneConcurrency.value.trim(),
        workerConcurrency: form.workerConcurrency.value.trim(),
      };
      const machinePools = pools();
      if (machinePools.length > 0) spec.machinePools = machinePools;
    }
    if (spec.type === "hosted") spec.hosted = hostedSpec();
    const result = await apiCall("POST", "/v1/clusters", { metadata: { name }, spec });
    if (!result.ok) {
      showError("create-error", result);
      return;
    }
    document.getElementById("create-error").textContent = "";
    const registration = result.data.registration || {};
    const imported = spec.type === "imported";
    document.getElementById("command").textContent = imported
      ? registration.importCommand
      : registration.hostCommand;
    document.getElementById("created-help").textContent = imported
      ? "Run this where kubectl reaches the cluster; the agents then connect to the hub."
      : spec.machinePools
        ? "The hub makes the pools' machines, which register themselves; hosts of your own join with this command (as root), with --etcd, --controlplane or --worker for their roles."
        : "Run this on each host (as root); add --etcd, --controlplane or --worker for its roles.";
    if (spec.type === "hosted") {
      document.getElementById("command").closest(".command").hidden = true;
      document.getElementById("created-help").textContent =
        "The hub makes it in the cloud, then installs the agents into it; its page shows how far it has got.";
    }
    document.getElementById("created-link").href = `/clusters/${encodeURIComponent(name)}`;
    form.hidden = true;
    document.getElementById("created").hidden = false;
  });
}

document.addEventListener("DOMContentLoaded", () => {
  setupLogin();
  setupLogout();
  setupTables();
  setupFleet();
  setupCopy();
  setupCreateCluster();
  setupEvents();
  setupClusterActions();
  setupCreateForms();
});
