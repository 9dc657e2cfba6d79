//! A real headless Chromium for the dashboard's tests, driven over WebDriver (Debian's
//! `chromium` and `chromium-driver`; `.ci/run` installs them). The few WebDriver commands the
//! tests use are plain JSON over HTTP to `chromedriver`, so they are spoken here directly.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::process::{Child, Command};

/// The key WebDriver names element references by.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A `chromedriver` process; each [`Browser`] is a session of it.
#[derive(Debug)]
pub struct Driver {
    _child: Child,
    port: u16,
    profiles: PathBuf,
    /// One browser test at a time in the test binary: Chromium takes a core of its own, and
    /// two of them beside the other tests left each page too slow to answer.
    _alone: tokio::sync::MutexGuard<'static, ()>,
}

static ONE_BROWSER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

impl Driver {
    /// Starts `chromedriver` on a free port; panics with what to install if it is missing.
    pub async fn start(profiles: &Path) -> Driver {
        let alone = ONE_BROWSER.lock().await;
        // The hosts' switch made now, not while the browser runs: Chromium drops its
        // connections when the root namespace's links change (see `hosts::switch`).
        if crate::hosts::is_root() {
            crate::hosts::switch();
        }
        for program in ["/usr/bin/chromium", "/usr/bin/chromedriver"] {
            assert!(
                Path::new(program).exists(),
                "{program} is missing: install Debian's chromium and chromium-driver (.ci/run does)"
            );
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let child = Command::new("/usr/bin/chromedriver")
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start chromedriver");
        let driver = Driver {
            _child: child,
            port,
            profiles: profiles.to_owned(),
            _alone: alone,
        };
        for _ in 0..200 {
            if let Ok((200, _)) = driver.call("GET", "/status", None).await {
                return driver;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("chromedriver did not answer on port {port} within 10 s");
    }

    async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<(u16, Value), String> {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .map_err(|e| e.to_string())?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let bytes = body.map(|b| b.to_string()).unwrap_or_default();
        let request = http::Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, format!("127.0.0.1:{}", self.port))
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(bytes)))
            .map_err(|e| e.to_string())?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok((status, serde_json::from_slice(&body).unwrap_or(Value::Null)))
    }

    /// A new headless browser window of `width` × `height` CSS pixels, with a profile of its own.
    pub async fn browser(&self, name: &str, width: u32, height: u32) -> Browser<'_> {
        let profile = self.profiles.join(format!("profile-{name}"));
        let _ = std::fs::remove_dir_all(&profile);
        std::fs::create_dir_all(&profile).unwrap();
        // Without the background-networking flags Chromium keeps dialling Google, which this
        // machine's closed network refuses.
        let args = [
            "--headless=new".to_owned(),
            "--no-sandbox".to_owned(),
            "--disable-gpu".to_owned(),
            "--disable-dev-shm-usage".to_owned(),
            "--disable-quic".to_owned(),
            "--no-first-run".to_owned(),
            "--disable-background-networking".to_owned(),
            "--disable-component-update".to_owned(),
            "--disable-sync".to_owned(),
            format!("--window-size={width},{height}"),
            // What the network did, for a failure's post-mortem (kept with the test's files).
            format!("--log-net-log={}", profile.join("netlog.json").display()),
            format!("--user-data-dir={}", profile.display()),
        ];
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            // The hub's certificate is from its own CA, which Chromium does not know.
            "acceptInsecureCerts": true,
            "goog:chromeOptions": {"binary": "/usr/bin/chromium", "args": args},
            // The console's messages, read by [`Browser::console_errors`].
            "goog:loggingPrefs": {"browser": "ALL"},
        }}});
        let (status, reply) = self
            .call("POST", "/session", Some(capabilities))
            .await
            .unwrap();
        assert_eq!(status, 200, "new browser session: {reply}");
        let session = reply["value"]["sessionId"].as_str().unwrap().to_owned();
        Browser {
            driver: self,
            session,
        }
    }
}

/// One browser session.
#[derive(Debug)]
pub struct Browser<'a> {
    driver: &'a Driver,
    session: String,
}

impl Browser<'_> {
    async fn command(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let full = format!("/session/{}{path}", self.session);
        let (status, reply) = self.driver.call(method, &full, body).await.unwrap();
        assert_eq!(status, 200, "{method} {path}: {reply}");
        reply["value"].clone()
    }

    /// The console's errors since this was last asked (a refused Content-Security-Policy, an
    /// uncaught exception, a resource that failed to load), as Chromium words them.
    pub async fn console_errors(&self) -> Vec<String> {
        let entries = self
            .command("POST", "/se/log", Some(json!({"type": "browser"})))
            .await;
        entries
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["level"] == "SEVERE")
            .map(|e| e["message"].as_str().unwrap_or_default().to_owned())
            .collect()
    }

    pub async fn goto(&self, url: &str) {
        self.command("POST", "/url", Some(json!({"url": url})))
            .await;
    }

    /// The page's URL and the start of its text, for a failure's message: a page that never
    /// came shows Chromium's own error (`ERR_…`) there.
    async fn where_now(&self) -> String {
        let text = self
            .run(
                "return document.body ? document.body.innerText.slice(0, 400) : '';",
                json!([]),
            )
            .await;
        format!("{} (page text: {text})", self.url().await)
    }

    pub async fn url(&self) -> String {
        self.command("GET", "/url", None)
            .await
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// The element `css` selects, waiting up to 30 s for it to exist (the end-to-end tests
    /// share two cores: a browser next to a busy test renders slowly).
    pub async fn find(&self, css: &str) -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while std::time::Instant::now() < deadline {
            let full = format!("/session/{}/element", self.session);
            let body = json!({"using": "css selector", "value": css});
            if let Ok((200, reply)) = self.driver.call("POST", &full, Some(body)).await {
                return reply["value"][ELEMENT].as_str().unwrap().to_owned();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!(
            "no element {css:?} within 30 s on {}",
            self.where_now().await
        );
    }

    /// Whether `css` selects anything now.
    pub async fn exists(&self, css: &str) -> bool {
        let found = self
            .command(
                "POST",
                "/elements",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await;
        found.as_array().is_some_and(|a| !a.is_empty())
    }

    /// A command on the element `css` selects; found again if a live redraw replaced it in
    /// between (the lists redraw their rows as they change).
    async fn on_element(
        &self,
        css: &str,
        method: &str,
        suffix: &str,
        body: Option<Value>,
    ) -> Value {
        for _ in 0..20 {
            let element = self.find(css).await;
            let path = format!("/session/{}/element/{element}{suffix}", self.session);
            let (status, reply) = self.driver.call(method, &path, body.clone()).await.unwrap();
            if status == 200 {
                return reply["value"].clone();
            }
            // A page that navigates between the find and the command leaves the element
            // behind: chromedriver says "stale element reference", or, when the old document
            // is half torn down, an inspector error that the node left the document.
            let replaced = reply["value"]["error"] == "stale element reference"
                || reply["value"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("does not belong to the document"));
            assert!(replaced, "{method} {suffix} on {css}: {reply}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{css} kept being replaced");
    }

    /// Sets a cookie for the page's origin (the browser must be on it), `HttpOnly` and
    /// `Secure`, as the hub sets its own: what a browser holds after a request the test made.
    pub async fn add_cookie(&self, name: &str, value: &str, path: &str) {
        self.command(
            "POST",
            "/cookie",
            Some(
                json!({"cookie": {"name": name, "value": value, "path": path,
                                   "secure": true, "httpOnly": true}}),
            ),
        )
        .await;
    }

    pub async fn type_into(&self, css: &str, text: &str) {
        self.on_element(css, "POST", "/value", Some(json!({"text": text})))
            .await;
    }

    pub async fn click(&self, css: &str) {
        self.on_element(css, "POST", "/click", Some(json!({})))
            .await;
    }

    /// The visible text of what `css` selects.
    pub async fn text(&self, css: &str) -> String {
        self.on_element(css, "GET", "/text", None)
            .await
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// Runs `script` (a function body; `arguments` are `args`) in the page.
    pub async fn run(&self, script: &str, args: Value) -> Value {
        self.command(
            "POST",
            "/execute/sync",
            Some(json!({"script": script, "args": args})),
        )
        .await
    }

    /// Waits up to `within` for `script` to return true.
    pub async fn until(&self, what: &str, within: Duration, script: &str) {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if self.run(script, json!([])).await == Value::Bool(true) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{what}: not within {within:?} on {}",
                self.where_now().await
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Saves a PNG of the window to `path`.
    pub async fn screenshot(&self, path: &Path) {
        let data = self.command("GET", "/screenshot", None).await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(data.as_str().unwrap())
            .unwrap();
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(path, png).unwrap();
    }

    /// Makes the window `width` × `height` CSS pixels.
    pub async fn resize(&self, width: u32, height: u32) {
        self.command(
            "POST",
            "/window/rect",
            Some(json!({"width": width, "height": height})),
        )
        .await;
    }

    pub async fn close(self) {
        let full = format!("/session/{}", self.session);
        let _ = self.driver.call("DELETE", &full, None).await;
    }
}

/// Controls without an accessible name, and text whose contrast with its background is below
/// WCAG AA (4.5:1), on the page as it stands.
const CHECK_PAGE: &str = r#"
const problems = [];
const named = (el) => {
  if (el.getAttribute("aria-label") || el.getAttribute("aria-labelledby")) return true;
  if (el.id && document.querySelector(`label[for="${el.id}"]`)) return true;
  if (el.closest("label")) return true;
  return (el.tagName === "BUTTON" || el.tagName === "A") && el.textContent.trim() !== "";
};
for (const el of document.querySelectorAll("input, select, textarea, button, a[href]")) {
  if (el.offsetParent !== null && !named(el)) problems.push(`unlabelled ${el.outerHTML.slice(0, 80)}`);
}
const rgb = (text) => (text.match(/[\d.]+/g) || []).map(Number);
const luminance = ([r, g, b]) => {
  const f = (c) => { c /= 255; return c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4; };
  return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
};
const background = (el) => {
  for (let e = el; e; e = e.parentElement) {
    const c = rgb(getComputedStyle(e).backgroundColor);
    if (c.length === 3 || (c.length === 4 && c[3] > 0)) return c.slice(0, 3);
  }
  return [255, 255, 255];
};
for (const el of document.querySelectorAll("body *")) {
  const own = Array.from(el.childNodes).some((n) => n.nodeType === 3 && n.textContent.trim() !== "");
  // Hidden text (xterm's character-measuring span) is read by no one.
  if (!own || el.offsetParent === null || getComputedStyle(el).visibility === "hidden") continue;
  const fg = luminance(rgb(getComputedStyle(el).color).slice(0, 3));
  const bg = luminance(background(el));
  const ratio = (Math.max(fg, bg) + 0.05) / (Math.min(fg, bg) + 0.05);
  if (ratio < 4.5) problems.push(`contrast ${ratio.toFixed(2)} for "${el.textContent.trim().slice(0, 40)}"`);
}
return problems;
"#;

/// Fails on console errors since the last check (a script's exception, a refused
/// Content-Security-Policy, an invalid `pattern`) and on accessibility problems of the page as
/// it stands ([`CHECK_PAGE`]), then saves it as `target/screenshots/<file>.png` for review.
pub async fn check_and_save_as(browser: &Browser<'_>, file: &str) {
    // What the hub's pages did wrong since the last check (Chromium starts each message with
    // the address of what logged it; an identity provider's own pages, visited on the way,
    // are not the hub's). A request the hub or the cluster refused is logged as "Failed to
    // load resource" too; the page says why itself, and tests make such requests on purpose,
    // so those lines are not its errors.
    let url = browser.url().await;
    let origin: String = url.split('/').take(3).collect::<Vec<_>>().join("/");
    let errors: Vec<String> = browser
        .console_errors()
        .await
        .into_iter()
        .filter(|e| e.starts_with(&format!("{origin}/")))
        .filter(|e| !e.contains("Failed to load resource: the server responded with a status of"))
        .collect();
    assert!(errors.is_empty(), "console errors by {url}: {errors:#?}");
    let problems = browser.run(CHECK_PAGE, json!([])).await;
    assert_eq!(
        problems,
        json!([]),
        "accessibility problems on {}",
        browser.url().await
    );
    browser
        .screenshot(&screenshot_dir().join(format!("{file}.png")))
        .await;
}

/// Where screenshots for review go: `target/screenshots/`.
pub fn screenshot_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/debug/deps/<test> → target
    exe.ancestors()
        .nth(3)
        .map_or_else(|| PathBuf::from("target"), Path::to_path_buf)
        .join("screenshots")
}
