// A git server over HTTPS, as a private one (a company's GitLab or Gitea) is reached: TLS with
// a certificate from a CA of the test's own, HTTP basic authentication, and git's own smart
// HTTP protocol answered by `git http-backend` (Debian's git) run as a CGI program, the way
// git's documentation sets it up behind a web server. Node.js's standard library only.
// Configured from $GIT_HTTP_CONFIG (JSON): {cert, key, root, username, password}; serves every
// repository below `root`. It prints {"url": "https://127.0.0.1:PORT"} on its first line once
// it listens.
import https from 'node:https';
import { spawn } from 'node:child_process';

const config = JSON.parse(process.env.GIT_HTTP_CONFIG);
const expected = 'Basic ' + Buffer.from(`${config.username}:${config.password}`).toString('base64');

const server = https.createServer({ cert: config.cert, key: config.key }, (req, res) => {
  const url = new URL(req.url, 'https://127.0.0.1');
  const allowed = req.headers.authorization === expected;
  if (!allowed) {
    res.writeHead(401, { 'www-authenticate': 'Basic realm="git"', 'content-type': 'text/plain' });
    res.end('authentication required\n');
    return;
  }
  // RFC 3875's variables, as http-backend reads them.
  const env = {
    PATH: process.env.PATH,
    GIT_PROJECT_ROOT: config.root,
    GIT_HTTP_EXPORT_ALL: '1',
    GATEWAY_INTERFACE: 'CGI/1.1',
    REQUEST_METHOD: req.method,
    PATH_INFO: decodeURIComponent(url.pathname),
    QUERY_STRING: url.search.replace(/^\?/, ''),
    CONTENT_TYPE: req.headers['content-type'] || '',
    REMOTE_USER: config.username,
    REMOTE_ADDR: req.socket.remoteAddress,
  };
  if (req.headers['content-length']) env.CONTENT_LENGTH = req.headers['content-length'];
  if (req.headers['content-encoding']) env.HTTP_CONTENT_ENCODING = req.headers['content-encoding'];
  if (req.headers['git-protocol']) env.GIT_PROTOCOL = req.headers['git-protocol'];
  const cgi = spawn('git', ['http-backend'], { env, stdio: ['pipe', 'pipe', 'inherit'] });
  req.pipe(cgi.stdin);
  // The CGI response: header lines up to a blank line (Status: sets the code), then the body.
  let head = Buffer.alloc(0);
  let started = false;
  cgi.stdout.on('data', (chunk) => {
    if (started) {
      res.write(chunk);
      return;
    }
    head = Buffer.concat([head, chunk]);
    const end = head.indexOf('\r\n\r\n');
    if (end < 0) return;
    let status = 200;
    const headers = {};
    for (const line of head.subarray(0, end).toString().split('\r\n')) {
      const colon = line.indexOf(':');
      const name = line.slice(0, colon).trim().toLowerCase();
      const value = line.slice(colon + 1).trim();
      if (name === 'status') status = Number(value.split(' ')[0]);
      else headers[name] = value;
    }
    res.writeHead(status, headers);
    started = true;
    res.write(head.subarray(end + 4));
  });
  cgi.on('close', (code) => {
    if (!started) {
      res.writeHead(500, { 'content-type': 'text/plain' });
      res.end(`git http-backend exited with ${code} before its headers\n`);
      return;
    }
    res.end();
  });
});

server.listen(0, '127.0.0.1', () => {
  console.log(JSON.stringify({ url: `https://127.0.0.1:${server.address().port}` }));
});
