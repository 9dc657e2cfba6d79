// The cluster explorer's script. Every request goes through the hub's authentication proxy
// (/k8s/clusters/NAME/...) with the browser's session, so it acts as the signed-in user and
// the cluster's RBAC decides; controls are shown only when a SelfSubjectAccessReview says the
// user may use them. Text from the cluster is only ever set as text (never as HTML).
"use strict";

const explorer = document.getElementById("explorer");
const cluster = explorer ? explorer.dataset.cluster : "";
const kubeBase = `/k8s/clusters/${encodeURIComponent(cluster)}`;
// The kinds the cluster-agent keeps in its watch-driven cache (`pods`, `deployments.apps`, ...):
// their lists are read from there (filtered, sorted and paged by the agent), not from the
// cluster's API server; the hub checks the user may list them, as the API server would.
const cachedKinds = new Set((explorer ? explorer.dataset.cached || "" : "").split(" ").filter(Boolean));
const cacheBase = `/v1/clusters/${encodeURIComponent(cluster)}/cache/`;
const TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io, application/json";
const PAGE_SIZE = 100;

// ---------- talking to the cluster ----------

async function kube(path, { method = "GET", body, accept = "application/json", contentType, base = kubeBase } = {}) {
  const headers = { Accept: accept };
  if (body !== undefined) headers["Content-Type"] = contentType || "application/json";
  const response = await fetch(base + path, {
    method,
    headers,
    body: body === undefined ? undefined : typeof body === "string" ? body : JSON.stringify(body),
    cache: "no-store",
  });
  // The session ended (logged out, or its time is up): log in again, then come back here.
  if (response.status === 401) {
    window.location.assign(`/login?next=${encodeURIComponent(window.location.pathname + window.location.search)}`);
  }
  const text = await response.text();
  let data = null;
  try {
    data = JSON.parse(text);
  } catch (_) {
    data = null;
  }
  return { ok: response.ok, status: response.status, data, text };
}

// Reads a Kubernetes watch (one JSON event a line) until it ends or `onEvent` answers false,
// handing each event on.
async function readEvents(response, onEvent) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    let chunk;
    try {
      chunk = await reader.read();
    } catch (_) {
      return;
    }
    if (chunk.done) return;
    buffer += chunk.value;
    let newline;
    while ((newline = buffer.indexOf("\n")) >= 0) {
      const line = buffer.slice(0, newline);
      buffer = buffer.slice(newline + 1);
      if (line.trim() && (await onEvent(JSON.parse(line))) === false) {
        reader.cancel().catch(() => {});
        return;
      }
    }
  }
}

// What to tell the user about a failed request: the cluster's (or hub's) own message.
function why(result) {
  const message = result.data && result.data.message;
  if (result.status === 409 && message) return `Conflict: ${message}`;
  return message || `The cluster answered ${result.status}.`;
}

function say(id, text) {
  const el = document.getElementById(id);
  if (!el) return;
  el.textContent = text;
  // An error is shown where the eye is: scrolled into view if it is not.
  if (text && el.getAttribute("role") === "alert") el.scrollIntoView({ block: "nearest" });
}

function element(tag, props = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (k === "dataset") Object.assign(el.dataset, v);
    else if (k in el) el[k] = v;
    else el.setAttribute(k, v);
  }
  el.append(...children);
  return el;
}

// ---------- discovery ----------

// Every resource the cluster serves (not subresources), each with its group, version and
// verbs; the preferred version of each group. Kept for the session's tab.
async function discover() {
  const key = `drover-discovery:${cluster}`;
  const kept = sessionStorage.getItem(key);
  if (kept) return JSON.parse(kept);
  const found = [];
  const add = (group, version, list) => {
    for (const r of list.resources || []) {
      if (r.name.includes("/")) continue;
      found.push({ group, version, name: r.name, kind: r.kind, namespaced: r.namespaced, verbs: r.verbs || [] });
    }
  };
  const core = await kube("/api/v1");
  if (!core.ok) throw new Error(why(core));
  add("", "v1", core.data);
  const groups = await kube("/apis");
  if (!groups.ok) throw new Error(why(groups));
  const lists = await Promise.all(
    (groups.data.groups || []).map(async (g) => {
      const v = g.preferredVersion.version;
      const list = await kube(`/apis/${g.name}/${v}`);
      return [g.name, v, list];
    }),
  );
  for (const [group, version, list] of lists) if (list.ok) add(group, version, list.data);
  sessionStorage.setItem(key, JSON.stringify(found));
  return found;
}

// `pods` or `deployments.apps`: how the explorer names a resource in its paths.
function resourceId(r) {
  return r.group ? `${r.name}.${r.group}` : r.name;
}

async function resolve(id) {
  const all = await discover();
  const found = all.find((r) => resourceId(r) === id);
  if (!found) throw new Error(`The cluster does not serve ${id}.`);
  return found;
}

// The API path of a resource's collection (in `namespace` when given), or of one object.
function apiPath(r, namespace, name) {
  let path = r.group ? `/apis/${r.group}/${r.version}` : `/api/${r.version}`;
  if (r.namespaced && namespace) path += `/namespaces/${encodeURIComponent(namespace)}`;
  path += `/${r.name}`;
  if (name) path += `/${encodeURIComponent(name)}`;
  return path;
}

function pagePath(r, namespace, name) {
  let path = `/clusters/${encodeURIComponent(cluster)}/explorer/${encodeURIComponent(resourceId(r))}`;
  if (r.namespaced && namespace) path += `/${encodeURIComponent(namespace)}`;
  return `${path}/${encodeURIComponent(name)}`;
}

// Which group of the kinds page a resource belongs to, as Rancher's explorer groups them;
// a group no Kubernetes release serves is custom.
const CATEGORIES = [
  ["Workloads", ["pods", "deployments", "statefulsets", "daemonsets", "replicasets", "jobs", "cronjobs"]],
  ["Service discovery", ["services", "endpoints", "endpointslices", "ingresses", "ingressclasses", "networkpolicies"]],
  ["Storage", ["persistentvolumes", "persistentvolumeclaims", "storageclasses", "volumeattachments", "csidrivers", "csinodes"]],
  ["Config", ["configmaps", "secrets", "resourcequotas", "limitranges", "horizontalpodautoscalers", "poddisruptionbudgets"]],
  ["RBAC", ["serviceaccounts", "roles", "rolebindings", "clusterroles", "clusterrolebindings"]],
  ["Cluster", ["namespaces", "nodes", "events", "leases", "customresourcedefinitions", "apiservices", "priorityclasses", "runtimeclasses"]],
];
const BUILT_IN_GROUPS = new Set(["", "apps", "batch", "policy", "autoscaling"]);

function category(r) {
  if (!BUILT_IN_GROUPS.has(r.group) && !r.group.endsWith(".k8s.io")) return "Custom";
  const hit = CATEGORIES.find(([, names]) => names.includes(r.name));
  return hit ? hit[0] : "Cluster";
}

// ---------- access ----------

const reviews = new Map();

// Whether the user may `verb` the resource (in `namespace`; a subresource such as `exec`).
async function can(verb, r, namespace, subresource, name) {
  const attributes = { verb, group: r.group, resource: r.name, namespace: namespace || "" };
  if (subresource) attributes.subresource = subresource;
  if (name) attributes.name = name;
  const key = JSON.stringify(attributes);
  if (!reviews.has(key)) {
    reviews.set(
      key,
      kube("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", {
        method: "POST",
        body: { apiVersion: "authorization.k8s.io/v1", kind: "SelfSubjectAccessReview", spec: { resourceAttributes: attributes } },
      }).then((result) => result.ok && result.data.status && result.data.status.allowed === true),
    );
  }
  return reviews.get(key);
}

// Whether the shell (a WebSocket exec: a GET) will be let in. kube-apiserver authorises that
// GET as `get pods/exec`; from 1.35 it also asks for `create` (the permission SPDY's POST
// always needed).
async function canOpenShell(r, namespace, name) {
  const version = await kube("/version");
  const minor = version.ok ? parseInt(String(version.data.minor || ""), 10) : NaN;
  const verbs = Number.isNaN(minor) || minor >= 35 ? ["get", "create"] : ["get"];
  for (const verb of verbs) {
    if (!(await can(verb, r, namespace, "exec", name))) return false;
  }
  return true;
}

// ---------- the cluster's dashboard ----------

// A gauge of what is asked (`used`) of what the nodes offer, as a meter and in words.
function gauge(label, used, of, unit) {
  const share = of > 0 ? Math.round((100 * used) / of) : 0;
  const words = `${label}: ${unit(used)} of ${unit(of)} (${share}%)`;
  const meter = element("meter", { min: 0, max: of > 0 ? of : 1, value: used, high: of * 0.8, optimum: 0, "aria-label": words });
  return element("div", { className: "gauge-line" }, element("span", {}, words), meter);
}

function drawOverview(o) {
  const cores = (n) => `${n.toFixed(2)} cores`;
  const gib = (bytes) => `${(bytes / 1024 ** 3).toFixed(2)} GiB`;
  const count = (n) => Math.round(n).toLocaleString("en");
  const gauges = [
    ["cpu", "CPU", o.cpu, cores, true],
    ["memory", "Memory", o.memory, gib, true],
    ["pods", "Pods", o.pods, count, false],
  ].map(([id, title, c, unit, limits]) => {
    const card = element("section", { className: "gauge card", id: `gauge-${id}`, "aria-label": title }, element("h3", {}, title));
    card.append(gauge("Requested", c.requested, c.allocatable, unit));
    if (limits) card.append(gauge("Limits", c.limits, c.allocatable, unit));
    return card;
  });
  document.getElementById("gauges").replaceChildren(...gauges);
  const health = document.getElementById("health");
  health.replaceChildren();
  const n = o.nodes;
  fact(health, "Nodes", `${n.ready} of ${n.total} ready${n.cordoned ? `, ${n.cordoned} cordoned` : ""}`);
  const p = o.podPhases;
  fact(health, "Pods", `${count(p.running)} running, ${count(p.pending)} pending, ${count(p.failed)} failed, ${count(p.succeeded)} succeeded${p.unknown ? `, ${count(p.unknown)} unknown` : ""}`);
  fact(health, "Deployments", `${o.deployments.available} of ${o.deployments.total} available`);
  fact(health, "Warning events", String(o.warningCount));
  const rows = o.warnings.map((w) => {
    const [kind, ...name] = w.object.split("/");
    return element("tr", {}, element("td", {}, w.lastSeen ? `${age(w.lastSeen)} ago` : "–"), element("td", {}, w.namespace), element("td", {}, `${kind} ${name.join("/")}`), element("td", {}, w.reason), element("td", {}, w.message), element("td", {}, String(w.count)));
  });
  if (rows.length === 0) rows.push(element("tr", {}, element("td", { colSpan: 6, className: "empty" }, "No warnings. Everything the cluster reports is normal.")));
  document.getElementById("warnings").tBodies[0].replaceChildren(...rows);
}

// The overview, read now and every 15 seconds while the tab is shown: the cluster-agent sums
// it from its caches, so asking costs the cluster's API server nothing.
async function showOverview(holder) {
  const read = async () => {
    if (document.hidden) return;
    const result = await kube("/overview", { base: `/v1/clusters/${encodeURIComponent(cluster)}` });
    if (!result.ok) {
      say("overview-status", "");
      say("overview-error", why(result));
      return;
    }
    say("overview-error", "");
    drawOverview(result.data);
    say("overview-status", `As of ${new Date().toLocaleTimeString("en-GB")}, from the cluster-agent's caches.`);
    holder.dataset.loaded = "true";
  };
  await read();
  setInterval(read, 15000);
}

// ---------- counting and the kinds beside every page ----------

// How many objects of `r` the user may list: one small list (limit=1), where the cache or the
// API server says how many remain.
async function countOf(r) {
  let result = null;
  if (cachedKinds.has(resourceId(r))) {
    // A cache still filling (503, seconds after the agent connects) answers in a moment:
    // asked again, for up to about 8 s, before the cluster's API server is.
    for (let wait = 250; ; wait *= 2) {
      result = await kube(`${r.name}?limit=1`, { base: cacheBase });
      if (result.status !== 503 || wait > 4000) break;
      await new Promise((done) => setTimeout(done, wait));
    }
  }
  if (!result || (!result.ok && result.status !== 403)) result = await kube(`${apiPath(r)}?limit=1`);
  if (!result.ok) return result.status === 403 ? "not allowed" : "–";
  const items = (result.data.items || []).length;
  const remaining = result.data.metadata && result.data.metadata.remainingItemCount;
  const more = result.data.metadata && result.data.metadata.continue;
  return remaining !== undefined ? String(items + remaining) : more ? `${items}+` : String(items);
}

// Counts every kind of `kinds`, four at a time, telling `shown` each as it comes.
async function countAll(kinds, shown) {
  const counts = {};
  const queue = kinds.slice();
  const worker = async () => {
    while (queue.length > 0) {
      const r = queue.shift();
      const text = await countOf(r);
      counts[resourceId(r)] = text;
      shown(r, text);
    }
  };
  await Promise.all([worker(), worker(), worker(), worker()]);
  return counts;
}

// Counts are kept for the tab a minute, so moving between pages does not count again.
const COUNTS_KEY = `drover-counts:${cluster}`;
function keepCounts(counts) {
  sessionStorage.setItem(COUNTS_KEY, JSON.stringify({ at: Date.now(), counts }));
}
function keptCounts() {
  try {
    const kept = JSON.parse(sessionStorage.getItem(COUNTS_KEY) || "null");
    return kept && Date.now() - kept.at < 60000 ? kept.counts : null;
  } catch (_) {
    return null;
  }
}

// The namespace (or `project:NAME`) chosen last on this cluster: every list starts there.
const NAMESPACE_KEY = `drover-namespace:${cluster}`;

// The kinds beside every explorer page, grouped (workloads, service discovery, …), with
// counts, the one shown marked; and the namespace picker every list follows.
async function showNav(nav) {
  let all;
  try {
    all = await discover();
  } catch (_) {
    return;
  }
  const listable = all.filter((r) => r.verbs.includes("list"));
  const here = decodeURIComponent((window.location.pathname.split("/explorer/")[1] || "").split("/")[0]);
  const picker = element("select", { id: "nav-namespace" });
  nav.append(element("label", { htmlFor: "nav-namespace" }, "Namespace"), picker);
  const chosen = new URLSearchParams(window.location.search).get("namespace") ?? localStorage.getItem(NAMESPACE_KEY) ?? "";
  picker.append(element("option", { value: "" }, "All namespaces"));
  fillNamespaces(picker, chosen).catch(() => {});
  picker.addEventListener("change", () => {
    localStorage.setItem(NAMESPACE_KEY, picker.value);
    // A list page shows the namespace chosen at once; another page, the next list opened.
    const list = document.getElementById("list-filters");
    const select = document.getElementById("namespace");
    if (list && select && !document.getElementById("namespace-field").hidden) {
      if (!Array.from(select.options).some((o) => o.value === picker.value)) select.append(element("option", { value: picker.value }, picker.value));
      select.value = picker.value;
      list.requestSubmit();
    }
  });
  const order = [...CATEGORIES.map(([name]) => name), "Custom"];
  const cells = new Map();
  for (const name of order) {
    const members = listable.filter((r) => category(r) === name).sort((a, b) => a.kind.localeCompare(b.kind));
    if (members.length === 0) continue;
    const list = element("ul");
    for (const r of members) {
      const id = resourceId(r);
      const link = element("a", { href: `/clusters/${encodeURIComponent(cluster)}/explorer/${encodeURIComponent(id)}` }, r.kind);
      if (id === here) link.setAttribute("aria-current", "page");
      const count = element("span", { className: "count", dataset: { resource: id } }, "");
      cells.set(id, count);
      list.append(element("li", { dataset: { resource: id } }, link, count));
    }
    nav.append(element("section", { "aria-label": name }, element("h2", {}, name), list));
  }
  const kept = keptCounts();
  if (kept) {
    for (const [id, text] of Object.entries(kept)) if (cells.has(id)) cells.get(id).textContent = text;
    return;
  }
  keepCounts(await countAll(listable, (r, text) => { cells.get(resourceId(r)).textContent = text; }));
}

// ---------- the list page ----------

// A project's namespaces (those labelled drover.io/project=NAME), from the cluster-agent's
// cache through the hub, which shows a project's members their own project's namespaces even
// where the cluster's RBAC does not let them list namespaces.
async function projectNamespaces(project) {
  const selector = encodeURIComponent(`drover.io/project=${project}`);
  const response = await fetch(`/v1/clusters/${encodeURIComponent(cluster)}/cache/namespaces?labelSelector=${selector}`, { cache: "no-store" });
  const data = await response.json().catch(() => null);
  if (!response.ok) throw new Error((data && data.message) || `The hub answered ${response.status}.`);
  return (data.items || []).map((n) => n.metadata.name).sort();
}

// Namespaces the user may pick, and the projects of this cluster.
async function fillNamespaces(select, chosen) {
  const option = (value, label) => select.append(element("option", { value }, label));
  const namespaces = await kube("/api/v1/namespaces");
  if (namespaces.ok) {
    const projects = new Set();
    for (const ns of namespaces.data.items || []) {
      option(ns.metadata.name, ns.metadata.name);
      const project = (ns.metadata.labels || {})["drover.io/project"];
      if (project) projects.add(project);
    }
    for (const project of [...projects].sort()) option(`project:${project}`, `Project ${project}`);
  } else {
    // No right to list namespaces: the user's projects on this cluster, and theirs.
    const projects = await fetch("/v1/projects", { cache: "no-store" }).then((r) => (r.ok ? r.json() : { items: [] }));
    for (const p of projects.items || []) {
      if (p.spec.cluster !== cluster) continue;
      option(`project:${p.metadata.name}`, `Project ${p.metadata.name}`);
      for (const ns of await projectNamespaces(p.metadata.name).catch(() => [])) option(ns, ns);
    }
  }
  if (chosen && !Array.from(select.options).some((o) => o.value === chosen)) {
    option(chosen, chosen.startsWith("project:") ? `Project ${chosen.slice(8)}` : chosen);
  }
  select.value = chosen || "";
}

// The namespaces a filter value stands for: one, a project's, or all (null).
async function namespacesOf(value) {
  if (!value) return null;
  if (!value.startsWith("project:")) return [value];
  return projectNamespaces(value.slice(8));
}

async function showList(holder) {
  const id = holder.dataset.resource;
  let r;
  try {
    r = await resolve(id);
  } catch (e) {
    say("list-error", e.message);
    return;
  }
  document.getElementById("list-title").textContent = `${r.kind} (${resourceId(r)})`;
  const params = new URLSearchParams(window.location.search);
  const form = document.getElementById("list-filters");
  const select = document.getElementById("namespace");
  form.labelSelector.value = params.get("labelSelector") || "";
  form.name.value = params.get("name") || "";
  if (r.name === "events") {
    document.getElementById("object-field").hidden = false;
    form.object.value = params.get("object") || "";
  }
  // The namespace the address names, else the one chosen last on this cluster.
  if (r.namespaced) {
    await fillNamespaces(select, params.get("namespace") ?? localStorage.getItem(NAMESPACE_KEY) ?? "");
    localStorage.setItem(NAMESPACE_KEY, select.value);
  }
  else document.getElementById("namespace-field").hidden = true;

  const table = document.getElementById("objects");
  const state = { pages: [], page: 0, rows: [], columns: [], watch: null, revision: null, sources: [], may: {}, mayAsked: null, mayIn: new Map(), askIn: null };

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const next = new URLSearchParams();
    if (r.namespaced && select.value) next.set("namespace", select.value);
    if (r.namespaced) {
      localStorage.setItem(NAMESPACE_KEY, select.value);
      const picker = document.getElementById("nav-namespace");
      if (picker && Array.from(picker.options).some((o) => o.value === select.value)) picker.value = select.value;
    }
    if (form.labelSelector.value.trim()) next.set("labelSelector", form.labelSelector.value.trim());
    if (form.name.value.trim()) next.set("name", form.name.value.trim());
    if (r.name === "events" && form.object.value.trim()) next.set("object", form.object.value.trim());
    const query = next.toString();
    window.history.replaceState(null, "", query ? `?${query}` : window.location.pathname);
    start();
  });

  // One page: from `cursor` ({source, token, skip}) on, `size` rows that match the name
  // filter, reading chunks (at most 500 rows each, kubectl's size) until the page is full or
  // the list ends. Returns the rows and the cursor of the next page (null at the end). A page
  // that fills in the middle of a chunk resumes by reading that chunk again (same token) and
  // skipping what it took.
  const readPage = async (cursor, size = PAGE_SIZE) => {
    if (state.cache) return readCached(cursor, size);
    const nameFilter = form.name.value.trim().toLowerCase();
    const rows = [];
    let { source, token } = cursor;
    let skip = cursor.skip || 0;
    let total = null;
    while (source < state.sources.length && rows.length < size) {
      const query = new URLSearchParams(state.sources[source].query);
      // With a name filter, read whole chunks: most of each is thrown away.
      query.set("limit", String(nameFilter ? 500 : Math.min(500, size - rows.length)));
      if (token) query.set("continue", token);
      const result = await kube(`${state.sources[source].path}?${query}`, { accept: TABLE });
      if (!result.ok) throw new Error(why(result));
      const data = result.data;
      const chunk = data.rows || [];
      const meta = data.metadata || {};
      if (data.columnDefinitions && data.columnDefinitions.length > 0) state.columns = data.columnDefinitions;
      if (state.revision === null) state.revision = meta.resourceVersion;
      if (state.sources.length === 1 && !nameFilter && !token && meta.remainingItemCount !== undefined) {
        total = chunk.length + meta.remainingItemCount;
      }
      let i = skip;
      skip = 0;
      for (; i < chunk.length && rows.length < size; i += 1) {
        if (!nameFilter || chunk[i].object.metadata.name.toLowerCase().includes(nameFilter)) rows.push(chunk[i]);
      }
      if (i < chunk.length) return { rows, next: { source, token, skip: i }, total };
      if (meta.continue) {
        token = meta.continue;
      } else {
        source += 1;
        token = null;
      }
    }
    const next = source < state.sources.length ? { source, token } : null;
    return { rows, next, total };
  };

  // One page from the cluster-agent's cache: one request, filtered, sorted (state.sortParam) and
  // counted there. After a change seen on the watch it asks for an answer at least as new
  // (resourceVersion=), so a page redrawn for the change shows it.
  const readCached = async (cursor, size) => {
    const query = new URLSearchParams(state.cache.query);
    if (size !== Infinity) query.set("limit", String(size));
    if (cursor.token) query.set("continue", cursor.token);
    if (state.sortParam) query.set("sort", state.sortParam);
    if (state.freshAs) query.set("resourceVersion", state.freshAs);
    const result = await kube(`${r.name}?${query}`, { accept: TABLE, base: cacheBase });
    if (!result.ok) {
      const failed = new Error(why(result));
      failed.status = result.status;
      throw failed;
    }
    const data = result.data;
    const meta = data.metadata || {};
    if (data.columnDefinitions && data.columnDefinitions.length > 0) state.columns = data.columnDefinitions;
    if (state.revision === null) state.revision = meta.resourceVersion;
    return { rows: data.rows || [], next: meta.continue ? { token: meta.continue } : null, total: null, remaining: meta.remainingItemCount || 0 };
  };

  const render = () => {
    const head = table.tHead;
    head.replaceChildren();
    const tr = element("tr");
    const showNamespace = r.namespaced && (state.sources.length !== 1 || !select.value);
    // Every column, the wide ones too (what `kubectl get -o wide` prints: a pod's IP and node,
    // a deployment's images), as Rancher's lists show them.
    const columns = state.columns;
    const sortable = (label, index) => {
      const button = element("button", { type: "button", className: "sort", dataset: { sort: String(index) } }, label);
      button.addEventListener("click", () => sortBy(label, index));
      return element("th", { scope: "col" }, button);
    };
    if (anyMay("delete")) {
      const all = element("input", { type: "checkbox", id: "select-all", "aria-label": "Select every row shown" });
      all.addEventListener("change", () => {
        for (const box of table.querySelectorAll("tbody input.select")) box.checked = all.checked;
        selectionChanged();
      });
      tr.append(element("th", { scope: "col" }, all));
    }
    if (showNamespace) tr.append(sortable("Namespace", -1));
    for (const c of columns) tr.append(sortable(c.name, state.columns.indexOf(c)));
    if (hasActions()) tr.append(element("th", { scope: "col" }, "Actions"));
    head.append(tr);
    const body = table.tBodies[0];
    body.replaceChildren();
    for (const row of state.rows) body.append(rowElement(row, columns, showNamespace));
    if (state.rows.length === 0) {
      // An empty table says what it is empty of, and whether the filters are why.
      const chosen = select.value;
      const where = !r.namespaced || !chosen ? "" : chosen.startsWith("project:") ? ` in project ${chosen.slice(8)}` : ` in namespace ${chosen}`;
      const filtered = form.labelSelector.value.trim() !== "" || form.name.value.trim() !== "";
      const text = `No ${r.name}${where}${filtered ? " match these filters" : ""}.`;
      body.append(element("tr", {}, element("td", { colSpan: tr.cells.length || 1, className: "empty" }, text)));
    }
    if (state.sortColumn !== undefined) applySortState();
    selectionChanged();
  };

  const rowElement = (row, columns, showNamespace) => {
    const meta = row.object.metadata;
    const tr = element("tr", { dataset: { name: meta.name, namespace: meta.namespace || "", uid: meta.uid || "" } });
    if (anyMay("delete")) {
      const cell = element("td");
      if (mayFor(meta).delete) {
        const box = element("input", { type: "checkbox", className: "select", "aria-label": `Select ${meta.namespace ? `${meta.namespace}/` : ""}${meta.name}` });
        box.addEventListener("change", selectionChanged);
        cell.append(box);
      }
      tr.append(cell);
    }
    if (showNamespace) tr.append(element("td", { dataset: { label: "Namespace" } }, meta.namespace || ""));
    columns.forEach((c, i) => {
      const index = state.columns.indexOf(c);
      let value = row.cells[index];
      if (value === null || value === undefined) value = "";
      const text = typeof value === "object" ? JSON.stringify(value) : String(value);
      const cell = element("td", { dataset: { label: c.name } });
      if (i === 0) cell.append(element("a", { href: pagePath(r, meta.namespace, meta.name) }, text));
      else cell.append(text);
      tr.append(cell);
    });
    if (hasActions()) tr.append(element("td", { dataset: { label: "Actions" }, className: "row-actions" }, rowMenu(meta)));
    return tr;
  };

  // What a row offers, as the kind allows and the user may in its namespace (decided by
  // SelfSubjectAccessReviews: once for the list in `start`, and for each namespace its rows
  // show when it spans several, in `showPage`): its page to edit the YAML, a pod's logs and
  // shell, a workload's scale and restart, delete (one object, with a confirmation naming it).
  const mayFor = (meta) => (meta.namespace && state.mayIn.get(meta.namespace)) || state.may;
  const anyMay = (what) => Boolean(state.may[what]) || [...state.mayIn.values()].some((may) => may[what]);
  const hasActions = () => Object.keys(state.may).some(anyMay);
  const patchRow = async (meta, sub, body, what, done) => {
    const target = `${apiPath(r, meta.namespace, meta.name)}${sub}`;
    const result = await kube(target, { method: "PATCH", body, contentType: "application/merge-patch+json" });
    if (!result.ok) {
      say("list-error", `${what}: ${why(result)}`);
      return;
    }
    say("list-error", "");
    say("list-status", done);
  };
  const rowActions = (meta) => {
    const page = pagePath(r, meta.namespace, meta.name);
    const what = `${r.kind} ${meta.namespace ? `${meta.namespace}/` : ""}${meta.name}`;
    const out = [];
    const may = mayFor(meta);
    const rowButton = (label, act) => {
      const button = element("button", { type: "button", className: "quiet-row", "aria-label": `${label} ${what}` }, label);
      button.addEventListener("click", act);
      out.push(button);
    };
    if (may.update) out.push(element("a", { href: `${page}#yaml-title`, "aria-label": `Edit the YAML of ${what}` }, "Edit YAML"));
    if (may.logs) out.push(element("a", { href: `${page}/logs` }, "Logs"));
    if (may.exec) out.push(element("a", { href: `${page}/shell` }, "Shell"));
    if (may.scale) {
      rowButton("Scale", async () => {
        const text = window.prompt(`Replicas for ${what}:`, "");
        if (text === null || text.trim() === "") return;
        const replicas = Number(text);
        if (!Number.isInteger(replicas) || replicas < 0) {
          say("list-error", `Not scaled: "${text}" is not a number of replicas; give a whole number, 0 or more.`);
          return;
        }
        await patchRow(meta, "/scale", { spec: { replicas } }, `Not scaled`, `Scaled ${what} to ${replicas} replicas.`);
      });
    }
    if (may.restart) {
      rowButton("Restart", async () => {
        if (!window.confirm(`Restart ${what}? Every pod is replaced, as kubectl rollout restart does.`)) return;
        // What `kubectl rollout restart` changes: a template annotation.
        const at = new Date().toISOString().replace(/\.\d+Z$/, "Z");
        await patchRow(meta, "", { spec: { template: { metadata: { annotations: { "kubectl.kubernetes.io/restartedAt": at } } } } }, "Not restarted", `Restart of ${what} requested at ${at}.`);
      });
    }
    if (may.delete) rowButton("Delete", () => deleteObjects([meta]));
    return out;
  };
  // The row's actions behind one button, opening below it in the row (a floating menu would be
  // cut off by the scrolling table).
  const rowMenu = (meta) => {
    const what = `${r.kind} ${meta.namespace ? `${meta.namespace}/` : ""}${meta.name}`;
    const menu = element("details", { className: "row-menu" }, element("summary", { "aria-label": `Actions for ${what}` }, "⋯"));
    menu.append(element("div", { className: "row-menu-items" }, ...rowActions(meta)));
    return menu;
  };
  const selected = () => Array.from(table.querySelectorAll("tbody input.select:checked")).map((box) => {
    const tr = box.closest("tr");
    return { name: tr.dataset.name, namespace: tr.dataset.namespace };
  });
  const selectionChanged = () => {
    const button = document.getElementById("delete-selected");
    const count = selected().length;
    button.hidden = !anyMay("delete");
    button.disabled = count === 0;
    button.textContent = count > 0 ? `Delete ${count} selected` : "Delete selected";
  };
  // Deletes `objects` after one confirmation that names every one; says what was refused.
  const deleteObjects = async (objects) => {
    if (objects.length === 0) return;
    const names = objects.map((o) => `${o.namespace ? `${o.namespace}/` : ""}${o.name}`);
    const noun = objects.length === 1 ? r.kind : `${objects.length} ${r.kind} objects`;
    if (!window.confirm(`Delete ${noun}: ${names.join(", ")}? This cannot be undone.`)) return;
    const refused = [];
    for (const o of objects) {
      const result = await kube(apiPath(r, o.namespace || null, o.name), { method: "DELETE" });
      if (!result.ok && result.status !== 404) refused.push(`${o.name}: ${why(result)}`);
    }
    const done = objects.length - refused.length;
    say("list-status", `Deleted ${done} of ${objects.length}.`);
    say("list-error", refused.length > 0 ? `Not deleted: ${refused.join("; ")}` : "");
  };
  document.getElementById("delete-selected").addEventListener("click", () => deleteObjects(selected()));

  // Sorting orders the whole list, not the page shown: the API server lists in namespace and
  // name order only, so every row is read (one page of no size limit), ordered here, and pages
  // become slices of that order until the filters change.
  const readAll = async () => (await readPage({ source: 0, token: null }, Infinity)).rows;
  // What a column sorts by: the namespace (-1), an age by its creation time (youngest first),
  // numbers as numbers, the rest as text with numbers in it ordered by value.
  const sortKey = (row, index) => {
    if (index === -1) return row.object.metadata.namespace || "";
    const column = state.columns[index];
    if (column && column.name === "Age") return -Date.parse(row.object.metadata.creationTimestamp || 0);
    const value = row.cells[index];
    return value === null || value === undefined ? "" : value;
  };
  const compare = (a, b) => (typeof a === "number" && typeof b === "number" ? a - b : String(a).localeCompare(String(b), undefined, { numeric: true }));
  // Reads and orders every row by the column chosen (state.sortColumn, state.sortDirection).
  const sortRows = async (label) => {
    const index = state.sortColumn;
    const started = performance.now();
    say("list-status", `Sorting every row by ${label}…`);
    let rows;
    try {
      rows = await readAll();
    } catch (e) {
      say("list-error", e.message);
      return;
    }
    const sign = state.sortDirection === "descending" ? -1 : 1;
    const meta = (row) => row.object.metadata;
    rows.sort((a, b) => sign * compare(sortKey(a, index), sortKey(b, index))
      || compare(meta(a).namespace || "", meta(b).namespace || "") || compare(meta(a).name, meta(b).name));
    state.sorted = rows;
    state.total = rows.length;
    await showPage(Math.min(state.page, Math.max(0, Math.ceil(rows.length / PAGE_SIZE) - 1)));
    say("list-status", `${rows.length} rows sorted by ${label} (${state.sortDirection}) in ${Math.round(performance.now() - started)} ms; following changes.`);
  };
  const sortBy = async (label, index) => {
    const same = state.sortColumn === index;
    state.sortDirection = same && state.sortDirection === "ascending" ? "descending" : "ascending";
    state.sortColumn = index;
    state.sortLabel = label;
    state.page = 0;
    if (state.cache) {
      // The cache sorts the whole list itself (by the column's name; ages by creation time).
      const started = performance.now();
      const column = index === -1 ? "Namespace" : state.columns[index].name;
      state.sortParam = `${state.sortDirection === "descending" ? "-" : ""}${column}`;
      state.pages = [{ source: 0, token: null }];
      if (await showPage(0)) {
        say("list-status", `${state.total} rows sorted by ${label} (${state.sortDirection}) in ${Math.round(performance.now() - started)} ms; following changes.`);
      }
      return;
    }
    await sortRows(label);
  };
  const applySortState = () => {
    const th = Array.from(table.tHead.rows[0].cells);
    th.forEach((cell) => cell.removeAttribute("aria-sort"));
    const at = th.find((cell) => cell.querySelector(`button[data-sort="${state.sortColumn}"]`));
    if (at) at.setAttribute("aria-sort", state.sortDirection);
  };

  const showPage = async (index) => {
    const started = performance.now();
    say("list-error", "");
    say("list-status", "Loading…");
    let read;
    if (state.sorted) {
      const rows = state.sorted.slice(index * PAGE_SIZE, (index + 1) * PAGE_SIZE);
      const next = (index + 1) * PAGE_SIZE < state.sorted.length ? {} : null;
      read = { rows, next, total: state.sorted.length };
    } else {
      try {
        read = await readPage(state.pages[index]);
      } catch (e) {
        if (state.cache && e.status !== 401 && e.status !== 403) {
          // The cache cannot answer (not filled yet, an agent without it): read through the
          // proxy instead, from the first page.
          state.cache = null;
          state.sortParam = null;
          state.sortColumn = undefined;
          state.pages = [{ source: 0, token: null }];
          return showPage(0);
        }
        say("list-status", "");
        say("list-error", e.message);
        return false;
      }
    }
    await state.mayAsked;
    // Rows from several namespaces: what each namespace shown allows, unless the cluster-wide
    // answers allow everything already (each review asked once, a page's all together).
    if (state.askIn && !Object.values(state.may).every(Boolean)) {
      const askIn = state.askIn;
      const fresh = [...new Set(read.rows.map((row) => row.object.metadata.namespace).filter((ns) => ns && !state.mayIn.has(ns)))];
      const answers = await Promise.all(fresh.map((ns) => askIn(ns)));
      fresh.forEach((ns, i) => state.mayIn.set(ns, answers[i]));
    }
    state.page = index;
    state.rows = read.rows;
    if (read.next) state.pages[index + 1] = read.next;
    else state.pages.length = index + 1;
    if (read.total !== null) state.total = read.total;
    if (read.remaining !== undefined) state.total = index * PAGE_SIZE + read.rows.length + read.remaining;
    render();
    const first = index * PAGE_SIZE + 1;
    const last = index * PAGE_SIZE + read.rows.length;
    const of = state.total !== undefined ? ` of ${state.total}` : read.next ? "" : ` of ${last}`;
    say("page-info", read.rows.length === 0 ? "No objects" : `${first}–${last}${of}`);
    document.getElementById("prev").disabled = index === 0;
    document.getElementById("next").disabled = !read.next;
    say("list-status", `Page ${index + 1} shown in ${Math.round(performance.now() - started)} ms; following changes.`);
    // Which query this page answers (the page's own state, for tests and bookmarks alike),
    // and when it was drawn (a User Timing mark: `bench explorer` reads it).
    holder.dataset.shown = window.location.search;
    holder.dataset.source = state.cache ? "cache" : "proxy";
    performance.mark("drover:list-drawn");
    return true;
  };

  document.getElementById("prev").addEventListener("click", () => showPage(Math.max(0, state.page - 1)));
  document.getElementById("next").addEventListener("click", () => showPage(state.page + 1));

  // Live: a watch of the same list (as a Table) from the first page's resourceVersion. A
  // change to a row shown is drawn in place; an object added or removed redraws the page.
  const follow = () => {
    if (state.watch) state.watch.abort();
    const controller = new AbortController();
    state.watch = controller;
    let redraw = null;
    const reload = () => {
      if (redraw !== null) return;
      redraw = setTimeout(() => {
        redraw = null;
        state.freshAs = state.revision;
        if (state.sorted) {
          // Objects came or went: read and order the whole list again.
          sortRows(state.sortLabel);
        } else {
          showPage(state.page);
        }
      }, state.sorted ? 1000 : 300);
    };
    const one = async (source) => {
      const query = new URLSearchParams(source.query);
      query.set("watch", "1");
      if (state.revision) query.set("resourceVersion", state.revision);
      query.set("allowWatchBookmarks", "true");
      let response;
      try {
        response = await fetch(`${kubeBase}${source.path}?${query}`, { headers: { Accept: TABLE }, signal: controller.signal, cache: "no-store" });
      } catch (_) {
        return;
      }
      if (!response.ok || !response.body) return;
      let behind = false;
      await readEvents(response, (event) => {
        if (event.type === "BOOKMARK") return true;
        if (event.type === "ERROR") {
          // Fell behind: list again from now.
          state.revision = null;
          reload();
          behind = true;
          return false;
        }
        const table = event.object;
        if (table.columnDefinitions && table.columnDefinitions.length > 0) state.columns = table.columnDefinitions;
        for (const row of table.rows || []) {
          const meta = row.object.metadata;
          if (meta.resourceVersion) state.revision = meta.resourceVersion;
          const shown = state.rows.findIndex((x) => x.object.metadata.uid === meta.uid);
          if (event.type === "MODIFIED" && shown >= 0) {
            state.rows[shown] = row;
            if (state.sorted) {
              const at = state.sorted.findIndex((x) => x.object.metadata.uid === meta.uid);
              if (at >= 0) state.sorted[at] = row;
            }
            render();
          } else if (event.type !== "MODIFIED" || shown >= 0) {
            reload();
          }
        }
        return true;
      });
      // The server ended the watch (its timeout): go on from where it stopped.
      if (!behind && !controller.signal.aborted) setTimeout(() => one(source), 1000);
    };
    for (const source of state.sources) one(source);
  };

  const start = async () => {
    const query = new URLSearchParams();
    const selector = form.labelSelector.value.trim();
    if (selector) query.set("labelSelector", selector);
    if (r.name === "events" && form.object.value.trim()) {
      query.set("fieldSelector", `involvedObject.name=${form.object.value.trim()}`);
    }
    let namespaces = null;
    try {
      namespaces = r.namespaced ? await namespacesOf(select.value) : null;
    } catch (e) {
      say("list-error", e.message);
      return;
    }
    state.sources = (namespaces || [null]).map((ns) => ({ path: apiPath(r, ns), query: query.toString() }));
    // The cache has no field selectors: events about one object are read through the proxy.
    // (A project without namespaces has nothing to read: no source at all, not "every namespace".)
    if (cachedKinds.has(resourceId(r)) && !query.has("fieldSelector") && !(namespaces && namespaces.length === 0)) {
      const cacheQuery = new URLSearchParams();
      if (selector) cacheQuery.set("labelSelector", selector);
      if (namespaces) cacheQuery.set("namespace", namespaces.join(","));
      if (form.name.value.trim()) cacheQuery.set("name", form.name.value.trim());
      state.cache = { query: cacheQuery.toString() };
    } else {
      state.cache = null;
    }
    // What the rows offer, asked for this list's namespace (every namespace: asked
    // cluster-wide, then for each namespace shown, as a project member may act in theirs).
    const askIn = (where) => {
      const allows = async (verb, sub) => r.verbs.includes(verb === "get" || verb === "create" ? "get" : verb) && (await can(verb, r, where, sub));
      // Only what the kind has is asked (so "allowed everything" means what it says).
      const asks = { delete: allows("delete"), update: allows("update") };
      if (r.name === "pods") {
        asks.logs = allows("get", "log");
        asks.exec = Promise.all([allows("create", "exec"), allows("get", "exec")]).then(([a, b]) => a && b);
      }
      if (["deployments", "statefulsets", "replicasets"].includes(r.name)) asks.scale = allows("patch", "scale");
      if (["deployments", "statefulsets", "daemonsets"].includes(r.name)) asks.restart = allows("patch");
      return Promise.all(Object.values(asks)).then((answers) => Object.fromEntries(Object.keys(asks).map((name, i) => [name, answers[i] === true])));
    };
    const where = namespaces && namespaces.length === 1 ? namespaces[0] : "";
    state.mayIn = new Map();
    state.askIn = r.namespaced && where === "" ? askIn : null;
    // Asked all at once, while the first page is read (`showPage` waits for the answers only
    // to draw): one after another, before the read, they held the page back a round trip each.
    state.mayAsked = askIn(where).then((may) => {
      state.may = may;
    });
    state.sortParam = null;
    state.freshAs = null;
    state.pages = [{ source: 0, token: null }];
    state.total = undefined;
    state.revision = null;
    state.sortColumn = undefined;
    state.sorted = null;
    await showPage(0);
    follow();
  };
  await start();

  // Create from YAML, for those who may create this kind (in the namespace chosen, if any).
  const namespace = r.namespaced && select.value && !select.value.startsWith("project:") ? select.value : "";
  if (r.verbs.includes("create") && (await can("create", r, namespace))) {
    const open = document.getElementById("create-open");
    open.hidden = false;
    const area = document.getElementById("create-yaml");
    area.value = `apiVersion: ${r.group ? `${r.group}/${r.version}` : r.version}\nkind: ${r.kind}\nmetadata:\n  name: \n${r.namespaced ? `  namespace: ${namespace || "default"}\n` : ""}`;
    highlightYaml(area);
    open.addEventListener("click", () => {
      document.getElementById("create").hidden = false;
      area.focus();
    });
    document.getElementById("create-submit").addEventListener("click", async () => {
      // The collection's namespace is the one the YAML names (the API server checks that the
      // two agree); without one, the namespace chosen, else `default`.
      const named = area.value.match(/^metadata:[^\n]*\n(?:[ \t]+[^\n]*\n)*?[ \t]+namespace:[ \t]*["']?([a-z0-9-]+)/m);
      const ns = r.namespaced ? (named ? named[1] : namespace || "default") : null;
      const result = await kube(apiPath(r, ns), { method: "POST", body: area.value, contentType: "application/yaml" });
      if (!result.ok) {
        say("create-error", why(result));
        return;
      }
      const meta = result.data.metadata;
      window.location.assign(pagePath(r, meta.namespace, meta.name));
    });
  }
  holder.dataset.ready = "true";
}

// ---------- one object ----------

// `age` ("3m", "5h") is app.js's, which every page loads first.
function fact(list, term, ...value) {
  list.append(element("dt", {}, term), element("dd", {}, ...value));
}

async function showObject(holder) {
  const { namespace, name } = holder.dataset;
  let r;
  try {
    r = await resolve(holder.dataset.resource);
  } catch (e) {
    say("object-error", e.message);
    return;
  }
  const path = apiPath(r, namespace, name);
  const load = await kube(path);
  if (!load.ok) {
    say("object-error", why(load));
    return;
  }
  const object = load.data;
  drawSummary(object);
  await showOwned(r, object);
  await showObjectEvents(object);
  const yaml = await showYaml(r, path, namespace, name);
  const actions = await showActions(r, object, path);
  followObject(r, namespace, name, object.metadata.resourceVersion, async (type, changed) => {
    if (type === "DELETED") {
      say("object-error", `${changed.kind} ${name} was deleted.`);
      return;
    }
    drawSummary(changed);
    actions.update(changed);
    yaml.changed();
    await showOwned(r, changed);
  });
}

// The summary of the object as it is: kind, labels, phase, replicas, node; its conditions and
// owners. Drawn again whenever the object changes.
function drawSummary(object) {
  const meta = object.metadata;
  // The kind as people say it ("Deployment shop/web"), now that the object says it.
  const title = `${object.kind} ${meta.namespace ? `${meta.namespace}/` : ""}${meta.name}`;
  document.querySelector("#one h1").textContent = title;
  document.title = `${title} · ${cluster} · Drover`;
  const facts = document.getElementById("facts");
  facts.replaceChildren();
  fact(facts, "Kind", `${object.kind} (${object.apiVersion})`);
  if (meta.namespace) fact(facts, "Namespace", meta.namespace);
  fact(facts, "Created", `${meta.creationTimestamp || ""} (${age(meta.creationTimestamp)} ago)`);
  const labels = Object.entries(meta.labels || {}).map(([k, v]) => `${k}=${v}`).join(", ");
  fact(facts, "Labels", labels || "none");
  const status = object.status || {};
  if (status.phase) fact(facts, "Phase", status.phase);
  if (object.spec && object.spec.replicas !== undefined) {
    fact(facts, "Replicas", `${status.readyReplicas || 0} ready of ${object.spec.replicas} wanted`);
  }
  if (object.spec && object.spec.nodeName) fact(facts, "Node", object.spec.nodeName);
  if (object.kind === "Node") {
    fact(facts, "Schedulable", object.spec && object.spec.unschedulable ? "no (cordoned)" : "yes");
    const taints = ((object.spec && object.spec.taints) || []).map((t) => `${t.key}${t.value ? `=${t.value}` : ""}:${t.effect}`);
    fact(facts, "Taints", taints.join(", ") || "none");
    const addresses = (status.addresses || []).map((a) => `${a.type} ${a.address}`);
    if (addresses.length > 0) fact(facts, "Addresses", addresses.join(", "));
    if (status.nodeInfo && status.nodeInfo.kubeletVersion) fact(facts, "Kubelet", status.nodeInfo.kubeletVersion);
    const allocatable = status.allocatable || {};
    fact(facts, "Allocatable", `CPU ${allocatable.cpu || "?"}, memory ${allocatable.memory || "?"}, pods ${allocatable.pods || "?"}`);
    // Filled in by showOwned, from the pods on the node.
    fact(facts, "Requested", element("span", { id: "node-requested" }, "…"));
  }
  const conditions = document.getElementById("conditions").tBodies[0];
  conditions.replaceChildren();
  for (const c of status.conditions || []) {
    conditions.append(element("tr", {}, element("td", {}, c.type || ""), element("td", {}, c.status || ""), element("td", {}, c.reason || ""), element("td", {}, c.message || "")));
  }
  const owners = document.getElementById("owners");
  owners.replaceChildren();
  for (const o of meta.ownerReferences || []) {
    owners.append(element("li", {}, `${o.kind} ${o.name}`));
  }
  if (owners.children.length === 0) owners.append(element("li", {}, "nothing"));
}

// Follows one object by a watch of its collection narrowed to its name, from the revision the
// page read: every change, the page's own or anyone's, is handed to `onChange` as it lands.
function followObject(r, namespace, name, revision, onChange) {
  let from = revision;
  const one = async () => {
    const query = new URLSearchParams({ watch: "1", fieldSelector: `metadata.name=${name}`, allowWatchBookmarks: "true" });
    if (from) query.set("resourceVersion", from);
    let response;
    try {
      response = await fetch(`${kubeBase}${apiPath(r, namespace)}?${query}`, { cache: "no-store" });
    } catch (_) {
      setTimeout(one, 2000);
      return;
    }
    if (!response.ok || !response.body) {
      setTimeout(one, 5000);
      return;
    }
    await readEvents(response, async (event) => {
      if (event.type === "ERROR") {
        // Too old to follow from: follow from now (the next change redraws the page).
        from = null;
        return false;
      }
      const meta = event.object.metadata || {};
      if (meta.resourceVersion) from = meta.resourceVersion;
      if (["ADDED", "MODIFIED", "DELETED"].includes(event.type)) await onChange(event.type, event.object);
      return true;
    });
    // The server ended the watch (its timeout): go on from where it stopped.
    setTimeout(one, 1000);
  };
  one();
}

// What the object owns: the pods of a workload (by its selector, as the workload finds them).
// A Kubernetes quantity as a number: CPU in cores ("250m" is 0.25), memory in bytes ("1Gi").
function quantity(text) {
  const match = /^([0-9.]+)([a-zA-Z]*)$/.exec(String(text || "").trim());
  if (!match) return 0;
  const scale = { "": 1, m: 1e-3, k: 1e3, M: 1e6, G: 1e9, T: 1e12, Ki: 1024, Mi: 1024 ** 2, Gi: 1024 ** 3, Ti: 1024 ** 4 }[match[2]];
  return scale === undefined ? 0 : Number(match[1]) * scale;
}

// What the pods on a node ask for and may use, beside what the node offers (as `kubectl
// describe node` adds them up: every container of every pod not yet finished).
function nodeUse(node, pods) {
  const sum = { cpu: [0, 0], memory: [0, 0] };
  for (const pod of pods) {
    if (pod.status && ["Succeeded", "Failed"].includes(pod.status.phase)) continue;
    for (const c of (pod.spec && pod.spec.containers) || []) {
      const resources = c.resources || {};
      for (const what of ["cpu", "memory"]) {
        sum[what][0] += quantity((resources.requests || {})[what]);
        sum[what][1] += quantity((resources.limits || {})[what]);
      }
    }
  }
  const allocatable = (node.status && node.status.allocatable) || {};
  const share = (value, of) => (quantity(of) > 0 ? ` (${Math.round((100 * value) / quantity(of))}%)` : "");
  const gib = (bytes) => `${(bytes / 1024 ** 3).toFixed(2)} GiB`;
  return `CPU ${sum.cpu[0].toFixed(2)}${share(sum.cpu[0], allocatable.cpu)}, limits ${sum.cpu[1].toFixed(2)}; memory ${gib(sum.memory[0])}${share(sum.memory[0], allocatable.memory)}, limits ${gib(sum.memory[1])}; pods ${pods.length}${share(pods.length, allocatable.pods)}`;
}

async function showOwned(r, object) {
  const owned = document.getElementById("owned");
  const items = [];
  const podResource = { group: "", version: "v1", name: "pods", namespaced: true };
  if (object.kind === "Node") {
    // A node "owns" the pods scheduled on it.
    document.getElementById("owned-title").textContent = "Pods on it";
    const pods = await kube(`/api/v1/pods?fieldSelector=${encodeURIComponent(`spec.nodeName=${object.metadata.name}`)}&limit=500`);
    if (pods.ok) {
      const list = pods.data.items || [];
      for (const p of list) {
        items.push(element("li", {}, element("a", { href: pagePath(podResource, p.metadata.namespace, p.metadata.name) }, `Pod ${p.metadata.namespace}/${p.metadata.name}`), ` ${(p.status && p.status.phase) || ""}`));
      }
      const requested = document.getElementById("node-requested");
      if (requested) requested.textContent = nodeUse(object, list);
    }
  }
  const selector = object.spec && object.spec.selector && (object.spec.selector.matchLabels || (r.name === "services" ? object.spec.selector : null));
  if (selector && Object.keys(selector).length > 0 && object.metadata.namespace) {
    const labels = Object.entries(selector).map(([k, v]) => `${k}=${v}`).join(",");
    const pods = await kube(`/api/v1/namespaces/${encodeURIComponent(object.metadata.namespace)}/pods?labelSelector=${encodeURIComponent(labels)}&limit=50`);
    if (pods.ok) {
      for (const p of pods.data.items || []) {
        items.push(element("li", {}, element("a", { href: pagePath(podResource, p.metadata.namespace, p.metadata.name) }, `Pod ${p.metadata.name}`), ` ${(p.status && p.status.phase) || ""}`));
      }
    }
  }
  if (items.length === 0) items.push(element("li", {}, "nothing"));
  owned.replaceChildren(...items);
}

async function showObjectEvents(object) {
  const meta = object.metadata;
  const fields = [`involvedObject.name=${meta.name}`];
  if (meta.namespace) fields.push(`involvedObject.namespace=${meta.namespace}`);
  const path = meta.namespace ? `/api/v1/namespaces/${encodeURIComponent(meta.namespace)}/events` : "/api/v1/events";
  const events = await kube(`${path}?fieldSelector=${encodeURIComponent(fields.join(","))}`);
  const body = document.getElementById("object-events").tBodies[0];
  if (!events.ok) {
    body.append(element("tr", {}, element("td", { colSpan: 4 }, why(events))));
    return;
  }
  const items = (events.data.items || []).filter((e) => e.involvedObject.kind === object.kind);
  for (const e of items) {
    body.append(element("tr", {}, element("td", {}, e.type || ""), element("td", {}, e.reason || ""), element("td", {}, e.message || ""), element("td", {}, e.lastTimestamp || e.eventTime || "")));
  }
  if (items.length === 0) body.append(element("tr", {}, element("td", { colSpan: 4 }, "No events about it.")));
}

// The lines of `before` and `after` as a diff: each line kept (" "), removed ("-") or added
// ("+"), in order (a longest common subsequence of lines).
function lineDiff(before, after) {
  const a = before.split("\n");
  const b = after.split("\n");
  const common = Array.from({ length: a.length + 1 }, () => new Array(b.length + 1).fill(0));
  for (let i = a.length - 1; i >= 0; i--) {
    for (let j = b.length - 1; j >= 0; j--) {
      common[i][j] = a[i] === b[j] ? common[i + 1][j + 1] + 1 : Math.max(common[i + 1][j], common[i][j + 1]);
    }
  }
  const out = [];
  let i = 0;
  let j = 0;
  while (i < a.length || j < b.length) {
    if (i < a.length && j < b.length && a[i] === b[j]) {
      out.push([" ", a[i]]);
      i++;
      j++;
    } else if (i < a.length && (j === b.length || common[i + 1][j] >= common[i][j + 1])) {
      // What goes before what comes, as `diff -u` shows a changed line.
      out.push(["-", a[i]]);
      i++;
    } else {
      out.push(["+", b[j]]);
      j++;
    }
  }
  return out;
}

// Draws a diff into `pre`: changed lines with two lines around them, "…" for what is between.
function drawDiff(pre, diff) {
  const near = diff.map((_, at) => diff.slice(Math.max(0, at - 2), at + 3).some(([mark]) => mark !== " "));
  const lines = [];
  let skipped = false;
  diff.forEach(([mark, text], at) => {
    if (!near[at]) {
      if (!skipped) lines.push(element("span", { className: "gap" }, "…"));
      skipped = true;
      return;
    }
    skipped = false;
    const className = mark === "+" ? "added" : mark === "-" ? "removed" : "same";
    lines.push(element("span", { className }, `${mark} ${text}`));
  });
  pre.replaceChildren(...lines);
}

// The YAML, as the API server writes it; those who may update the object edit it in place.
// ---------- YAML, coloured ----------

// One YAML value's class: quoted or plain text, a number, or true/false/null.
function yamlValueClass(text) {
  if (/^-?(\d+|\d*\.\d+)([eE][-+]?\d+)?$/.test(text)) return "yaml-number";
  if (/^(true|false|null|~|True|False|Null|TRUE|FALSE|NULL)$/.test(text)) return "yaml-literal";
  if (/^[|>][-+0-9]*$/.test(text)) return "yaml-marker";
  return "yaml-string";
}

// Where a value's trailing comment starts (" #" outside quotes), or -1.
function yamlCommentAt(text) {
  let quote = "";
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (quote) {
      if (c === quote) quote = "";
    } else if (c === '"' || c === "'") {
      quote = c;
    } else if (c === "#" && (i === 0 || /\s/.test(text[i - 1]))) {
      return i;
    }
  }
  return -1;
}

// The spans of one line as [class, text] ("" for plain), and whether a block scalar (`|`, `>`)
// starts after it. `inBlock`: the line belongs to a block scalar's text.
function yamlLine(line, inBlock) {
  if (inBlock) return { spans: [["yaml-string", line]], opens: false };
  if (/^\s*#/.test(line)) return { spans: [["yaml-comment", line]], opens: false };
  if (/^(---|\.\.\.)(\s|$)/.test(line)) return { spans: [["yaml-marker", line]], opens: false };
  const spans = [];
  let rest = line;
  const lead = /^(\s*(?:-\s+)*)/.exec(rest)[1];
  if (lead) spans.push(["", lead]);
  rest = rest.slice(lead.length);
  const key = /^("[^"]*"|'[^']*'|[^\s#"'][^:#]*?)(:)(\s|$)/.exec(rest);
  if (key) {
    spans.push(["yaml-key", key[1]], ["", key[2] + key[3]]);
    rest = rest.slice(key[0].length);
  }
  const comment = yamlCommentAt(rest);
  const value = comment >= 0 ? rest.slice(0, comment) : rest;
  const trimmed = value.trim();
  if (trimmed) {
    const start = value.indexOf(trimmed);
    spans.push(["", value.slice(0, start)], [yamlValueClass(trimmed), trimmed], ["", value.slice(start + trimmed.length)]);
  } else if (value) {
    spans.push(["", value]);
  }
  if (comment >= 0) spans.push(["yaml-comment", rest.slice(comment)]);
  return { spans, opens: /^[|>][-+0-9]*$/.test(trimmed) };
}

// Colours `area`'s YAML as it is typed: a highlighted copy of the text lies under the
// textarea, whose own text is transparent (its caret and selection are not), scrolled with
// it. Returns the function that redraws the copy, for when the script sets the text.
function highlightYaml(area) {
  const wrap = element("div", { className: "code-editor" });
  const under = element("pre", { className: "code-under", id: `${area.id}-highlight`, "aria-hidden": "true" });
  area.setAttribute("wrap", "off");
  area.classList.add("code-over");
  area.replaceWith(wrap);
  wrap.append(under, area);
  const draw = () => {
    const out = [];
    let block = -1;
    for (const line of area.value.split("\n")) {
      const indent = /^\s*/.exec(line)[0].length;
      const inBlock = block >= 0 && (line.trim() === "" || indent > block);
      if (!inBlock) block = -1;
      const { spans, opens } = yamlLine(line, inBlock);
      if (opens) block = indent;
      for (const [cls, text] of spans) out.push(cls ? element("span", { className: cls }, text) : text);
      out.push("\n");
    }
    under.replaceChildren(...out);
    under.scrollTop = area.scrollTop;
    under.scrollLeft = area.scrollLeft;
  };
  let queued = false;
  area.addEventListener("input", () => {
    if (queued) return;
    queued = true;
    requestAnimationFrame(() => {
      queued = false;
      draw();
    });
  });
  area.addEventListener("scroll", () => {
    under.scrollTop = area.scrollTop;
    under.scrollLeft = area.scrollLeft;
  });
  draw();
  return draw;
}

// Saving first shows what changes (a diff against the YAML as read), then sends it whole (a
// replace): if the object changed since it was read, the API server refuses with a conflict
// on its resourceVersion, and nothing is overwritten. Returns `changed()`, which the page calls
// when the object changes: the YAML shown is read again, unless it is being edited, and then
// the editor is told.
async function showYaml(r, path, namespace, name) {
  const area = document.getElementById("yaml");
  const redraw = highlightYaml(area);
  let original = "";
  let saving = false;
  const read = async () => {
    const result = await kube(path, { accept: "application/yaml" });
    if (!result.ok) {
      say("yaml-error", why(result));
      return;
    }
    original = result.text;
    area.value = result.text;
    redraw();
  };
  await read();
  const view = {
    changed: async () => {
      if (saving) return;
      if (area.readOnly) {
        await read();
      } else {
        say("yaml-status", "The object changed since you began editing: saving would be refused. Cancel shows the current version.");
      }
    },
  };
  if (!r.verbs.includes("update") || !(await can("update", r, namespace, undefined, name))) return view;
  const [edit, save, cancel, confirmBox, confirm, back] = ["edit", "save", "cancel", "yaml-confirm", "save-confirm", "save-back"].map((id) => document.getElementById(id));
  edit.hidden = false;
  const editing = (on) => {
    area.readOnly = !on;
    edit.hidden = on;
    save.hidden = !on;
    cancel.hidden = !on;
    confirmBox.hidden = true;
  };
  edit.addEventListener("click", () => {
    editing(true);
    say("yaml-status", "Editing: Save shows what changes, then replaces the object with this YAML.");
    area.focus();
  });
  cancel.addEventListener("click", async () => {
    editing(false);
    say("yaml-error", "");
    say("yaml-status", "");
    await read();
  });
  save.addEventListener("click", () => {
    say("yaml-error", "");
    const diff = lineDiff(original, area.value);
    if (diff.every(([mark]) => mark === " ")) {
      say("yaml-status", "Nothing to save: the YAML is as it was read.");
      return;
    }
    drawDiff(document.getElementById("yaml-diff"), diff);
    confirmBox.hidden = false;
    save.hidden = true;
    confirm.focus();
  });
  back.addEventListener("click", () => {
    confirmBox.hidden = true;
    save.hidden = false;
    area.focus();
  });
  confirm.addEventListener("click", async () => {
    saving = true;
    try {
      const result = await kube(path, { method: "PUT", body: area.value, contentType: "application/yaml" });
      if (!result.ok) {
        confirmBox.hidden = true;
        save.hidden = false;
        say("yaml-error", result.status === 409
          ? `Not saved: the object was changed by someone else since you opened it (${why(result)}). Cancel to see the current version, then edit again.`
          : `Not saved: ${why(result)}`);
        return;
      }
      editing(false);
      say("yaml-status", `Saved (resourceVersion ${result.data.metadata.resourceVersion}).`);
      await read();
    } finally {
      saving = false;
    }
  });
  return view;
}

function actionButton(label, id, act) {
  const button = element("button", { type: "button", id }, label);
  button.addEventListener("click", async () => {
    say("object-error", "");
    button.disabled = true;
    try {
      await act(button);
    } finally {
      button.disabled = false;
    }
  });
  document.getElementById("actions").append(button);
  return button;
}

async function showActions(r, object, path) {
  const meta = object.metadata;
  const ns = meta.namespace;
  const done = (text) => say("action-status", text);
  const failed = (result) => {
    say("object-error", why(result));
    return false;
  };
  const patch = (target, body) => kube(target, { method: "PATCH", body, contentType: "application/merge-patch+json" });
  if (r.name === "pods") {
    const podPage = pagePath(r, ns, meta.name);
    if (await can("get", r, ns, "log", meta.name)) {
      document.getElementById("actions").append(element("a", { className: "button", href: `${podPage}/logs`, id: "logs-link" }, "Logs"));
    }
    if (await canOpenShell(r, ns, meta.name)) {
      document.getElementById("actions").append(element("a", { className: "button", href: `${podPage}/shell`, id: "shell-link" }, "Shell"));
    }
  }
  if (["deployments", "statefulsets", "replicasets"].includes(r.name) && (await can("patch", r, ns, "scale", meta.name))) {
    const input = element("input", { type: "number", min: "0", id: "replicas", value: String(object.spec.replicas ?? 1) });
    document.getElementById("actions").append(element("label", { htmlFor: "replicas", className: "inline" }, "Replicas"), input);
    actionButton("Scale", "scale", async () => {
      const replicas = Number(input.value);
      const result = await patch(`${path}/scale`, { spec: { replicas } });
      if (!result.ok) return failed(result);
      done(`Scaled to ${replicas} replicas.`);
      return true;
    });
  }
  if (["deployments", "statefulsets", "daemonsets"].includes(r.name) && (await can("patch", r, ns, undefined, meta.name))) {
    actionButton("Restart", "restart", async () => {
      // What `kubectl rollout restart` changes: a template annotation, so every pod is replaced.
      const at = new Date().toISOString().replace(/\.\d+Z$/, "Z");
      const result = await patch(path, { spec: { template: { metadata: { annotations: { "kubectl.kubernetes.io/restartedAt": at } } } } });
      if (!result.ok) return failed(result);
      done(`Restart requested at ${at}.`);
      return true;
    });
  }
  if (r.name === "nodes" && (await can("patch", r, "", undefined, meta.name))) {
    const cordoned = object.spec && object.spec.unschedulable === true;
    const cordon = actionButton(cordoned ? "Uncordon" : "Cordon", "cordon", async (button) => {
      const now = button.textContent === "Cordon";
      const result = await patch(path, { spec: { unschedulable: now ? true : null } });
      if (!result.ok) return failed(result);
      button.textContent = now ? "Uncordon" : "Cordon";
      done(now ? `${meta.name} is cordoned: no new pods are scheduled on it.` : `${meta.name} is schedulable again.`);
      return true;
    });
    actionButton("Drain", "drain", async () => {
      if (!window.confirm(`Drain node ${meta.name}? It is cordoned and its pods (but DaemonSet and mirror pods) are evicted.`)) return;
      done(`Draining ${meta.name}…`);
      const response = await fetch(`/v1/clusters/${encodeURIComponent(cluster)}/nodes/${encodeURIComponent(meta.name)}/drain`, { method: "POST" });
      const data = await response.json().catch(() => null);
      if (!response.ok) {
        say("object-error", (data && data.message) || `The hub answered ${response.status}.`);
        done("");
        return;
      }
      cordon.textContent = "Uncordon";
      done(data.message);
    });
  }
  if (r.verbs.includes("delete") && (await can("delete", r, ns, undefined, meta.name))) {
    actionButton("Delete", "delete", async () => {
      const what = `${object.kind} ${ns ? `${ns}/` : ""}${meta.name}`;
      if (!window.confirm(`Delete ${what}? This cannot be undone.`)) return;
      const result = await kube(path, { method: "DELETE" });
      if (!result.ok) return failed(result);
      const list = `/clusters/${encodeURIComponent(cluster)}/explorer/${encodeURIComponent(resourceId(r))}`;
      window.location.assign(ns ? `${list}?namespace=${encodeURIComponent(ns)}` : list);
      return true;
    });
  }
  // Every control the user may use is shown (for tests and screen readers alike: the page
  // has settled).
  document.getElementById("actions").dataset.ready = "true";
  // The controls that show the object's state follow it (unless the user is typing there).
  return {
    update: (changed) => {
      const replicas = document.getElementById("replicas");
      if (replicas && document.activeElement !== replicas && changed.spec) replicas.value = String(changed.spec.replicas ?? 1);
      const cordon = document.getElementById("cordon");
      if (cordon && changed.spec) cordon.textContent = changed.spec.unschedulable === true ? "Uncordon" : "Cordon";
    },
  };
}

// ---------- a pod's logs ----------

async function containersOf(holder, select) {
  const pod = await kube(`/api/v1/namespaces/${encodeURIComponent(holder.dataset.namespace)}/pods/${encodeURIComponent(holder.dataset.name)}`);
  if (!pod.ok) throw new Error(why(pod));
  for (const c of pod.data.spec.containers || []) select.append(element("option", { value: c.name }, c.name));
  const asked = new URLSearchParams(window.location.search).get("container");
  if (asked) select.value = asked;
  return pod.data;
}

async function showLogs(holder) {
  const select = document.getElementById("container");
  try {
    await containersOf(holder, select);
  } catch (e) {
    say("log-error", e.message);
    return;
  }
  const form = document.getElementById("log-options");
  const out = document.getElementById("log");
  let controller = null;
  const stream = async () => {
    if (controller) controller.abort();
    controller = new AbortController();
    const mine = controller;
    out.textContent = "";
    say("log-error", "");
    const query = new URLSearchParams({ container: select.value });
    const tail = document.getElementById("tail").value;
    if (tail) query.set("tailLines", tail);
    const follow = document.getElementById("follow").checked;
    if (follow) query.set("follow", "true");
    if (document.getElementById("previous").checked) query.set("previous", "true");
    if (document.getElementById("timestamps").checked) query.set("timestamps", "true");
    const path = `/api/v1/namespaces/${encodeURIComponent(holder.dataset.namespace)}/pods/${encodeURIComponent(holder.dataset.name)}/log?${query}`;
    say("log-status", follow ? "Following the log…" : "Reading the log…");
    let response;
    try {
      response = await fetch(kubeBase + path, { signal: mine.signal, cache: "no-store" });
    } catch (_) {
      return;
    }
    if (!response.ok) {
      const data = await response.json().catch(() => null);
      say("log-status", "");
      say("log-error", (data && data.message) || `The cluster answered ${response.status}.`);
      return;
    }
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    for (;;) {
      let chunk;
      try {
        chunk = await reader.read();
      } catch (_) {
        if (mine.signal.aborted) return;
        break;
      }
      if (chunk.done) break;
      const atBottom = out.scrollTop + out.clientHeight >= out.scrollHeight - 4;
      out.append(chunk.value);
      if (atBottom) out.scrollTop = out.scrollHeight;
    }
    if (!mine.signal.aborted) {
      say("log-status", follow ? "The log ended: the container stopped or the connection closed." : "End of the log.");
      out.dataset.ended = "true";
    }
  };
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    stream();
  });
  document.getElementById("download").addEventListener("click", () => {
    const blob = new Blob([out.textContent], { type: "text/plain" });
    const link = element("a", { href: URL.createObjectURL(blob), download: `${holder.dataset.name}-${select.value}.log`, id: "log-download" }, "log");
    link.hidden = true;
    document.body.append(link);
    link.click();
  });
  stream();
}

// ---------- a shell ----------

// kubectl's exec protocol over WebSocket: each message is one channel's bytes after a channel
// byte (0 stdin, 1 stdout, 2 stderr, 3 the closing status, 4 the terminal's size).
async function showShell(holder) {
  const select = document.getElementById("container");
  try {
    await containersOf(holder, select);
  } catch (e) {
    say("shell-error", e.message);
    return;
  }
  const terminal = new Terminal({ cursorBlink: true, fontFamily: "monospace", fontSize: 14, theme: { background: "#101722", foreground: "#e8edf4" } });
  const fit = new FitAddon.FitAddon();
  terminal.loadAddon(fit);
  terminal.open(document.getElementById("terminal"));
  fit.fit();
  const encoder = new TextEncoder();
  let socket = null;
  const send = (channel, bytes) => {
    if (!socket || socket.readyState !== WebSocket.OPEN) return;
    const message = new Uint8Array(bytes.length + 1);
    message[0] = channel;
    message.set(bytes, 1);
    socket.send(message);
  };
  const sendSize = () => send(4, encoder.encode(JSON.stringify({ Width: terminal.cols, Height: terminal.rows })));
  terminal.onData((data) => send(0, encoder.encode(data)));
  terminal.onResize(sendSize);
  window.addEventListener("resize", () => fit.fit());
  const connect = () => {
    if (socket) socket.close();
    const query = new URLSearchParams({ container: select.value, stdin: "true", stdout: "true", tty: "true" });
    for (const word of document.getElementById("command").value.trim().split(/\s+/)) if (word) query.append("command", word);
    const scheme = window.location.protocol === "https:" ? "wss" : "ws";
    const url = `${scheme}://${window.location.host}${kubeBase}/api/v1/namespaces/${encodeURIComponent(holder.dataset.namespace)}/pods/${encodeURIComponent(holder.dataset.name)}/exec?${query}`;
    say("shell-error", "");
    say("shell-status", "Connecting…");
    const mine = new WebSocket(url, ["v5.channel.k8s.io", "v4.channel.k8s.io"]);
    socket = mine;
    mine.binaryType = "arraybuffer";
    const decoder = new TextDecoder();
    let opened = false;
    mine.addEventListener("open", () => {
      opened = true;
      holder.dataset.connected = "true";
      say("shell-status", `Connected to ${select.value} (${mine.protocol}).`);
      sendSize();
      terminal.focus();
    });
    mine.addEventListener("message", (message) => {
      const bytes = new Uint8Array(message.data);
      if (bytes.length === 0) return;
      const body = bytes.subarray(1);
      if (bytes[0] === 1 || bytes[0] === 2) terminal.write(body);
      else if (bytes[0] === 3) {
        const status = JSON.parse(decoder.decode(body));
        say("shell-status", status.status === "Success" ? "The shell exited." : `The shell ended: ${status.message || status.reason}.`);
      }
    });
    mine.addEventListener("close", () => {
      holder.dataset.connected = "false";
      if (!opened) say("shell-error", "Could not open the shell: the cluster refused the exec, or you may not run commands in this pod.");
      else if (!document.getElementById("shell-status").textContent.includes("exited")) say("shell-status", "The session ended.");
    });
  };
  document.getElementById("shell-options").addEventListener("submit", (event) => {
    event.preventDefault();
    connect();
  });
  connect();
}

// An open row menu closes when the user clicks anywhere else.
document.addEventListener("click", (event) => {
  for (const open of document.querySelectorAll("details.row-menu[open]")) {
    if (!open.contains(event.target)) open.open = false;
  }
});

document.addEventListener("DOMContentLoaded", () => {
  const views = { overview: showOverview, list: showList, object: showObject, logs: showLogs, shell: showShell };
  for (const holder of document.querySelectorAll("[data-view]")) {
    const show = views[holder.dataset.view];
    if (show) show(holder);
  }
  const nav = document.getElementById("kinds-nav");
  if (nav) showNav(nav);
});
