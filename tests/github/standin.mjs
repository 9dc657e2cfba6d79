// A STAND-IN for GitHub (github.com cannot be reached from the machines the tests run on): the
// OAuth app web flow and the REST endpoints the hub calls, answering with the shapes GitHub
// documents (docs.github.com: "Authorizing OAuth apps"; REST "Users", "Organizations",
// "Teams"), served as GitHub Enterprise Server serves them (the API under /api/v3), over HTTPS.
// Node.js's standard library only. Configured from $GITHUB_CONFIG (JSON):
//   {cert, key, clientId, clientSecret, users: {login: {id, name, orgs: [..], teams: [{org, slug}]}},
//    signedIn: login}
// It prints {"url": "https://127.0.0.1:PORT"} on its first line once it listens.
//
// Like github.com for an app the user authorized before, /login/oauth/authorize sends the
// browser straight back with a code for the user signed in here. Test hooks under /__test/:
//   POST /__test/users {login: {...}}  replaces the users (orgs and teams change, users go)
import https from 'node:https';
import crypto from 'node:crypto';

const config = JSON.parse(process.env.GITHUB_CONFIG);
let users = config.users;
const codes = new Map(); // code -> {login, redirectUri, challenge}
const tokens = new Map(); // access token -> login

function send(res, status, body, headers = {}) {
  res.writeHead(status, { 'content-type': 'application/json; charset=utf-8', ...headers });
  res.end(JSON.stringify(body));
}

async function body(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  return Buffer.concat(chunks).toString();
}

function page(list, url) {
  const perPage = Math.min(Number(url.searchParams.get('per_page') || 30), 100);
  const number = Math.max(Number(url.searchParams.get('page') || 1), 1);
  return list.slice((number - 1) * perPage, number * perPage);
}

const server = https.createServer({ cert: config.cert, key: config.key }, async (req, res) => {
  const url = new URL(req.url, 'https://127.0.0.1');
  if (req.method === 'POST' && url.pathname === '/__test/users') {
    users = JSON.parse(await body(req));
    for (const [token, login] of tokens) if (!users[login]) tokens.delete(token);
    res.writeHead(204);
    res.end();
    return;
  }
  if (req.method === 'GET' && url.pathname === '/login/oauth/authorize') {
    const q = url.searchParams;
    if (q.get('client_id') !== config.clientId) {
      send(res, 404, { message: 'Not Found' });
      return;
    }
    const code = crypto.randomBytes(10).toString('hex');
    codes.set(code, {
      login: config.signedIn,
      redirectUri: q.get('redirect_uri'),
      challenge: q.get('code_challenge'),
    });
    const back = new URL(q.get('redirect_uri'));
    back.searchParams.set('code', code);
    back.searchParams.set('state', q.get('state') || '');
    res.writeHead(302, { location: back.toString() });
    res.end();
    return;
  }
  if (req.method === 'POST' && url.pathname === '/login/oauth/access_token') {
    const form = new URLSearchParams(await body(req));
    const grant = codes.get(form.get('code'));
    codes.delete(form.get('code'));
    const refuse = (error, description) => send(res, 200, { error, error_description: description });
    if (form.get('client_id') !== config.clientId || form.get('client_secret') !== config.clientSecret) {
      refuse('incorrect_client_credentials', 'The client_id and/or client_secret passed are incorrect.');
      return;
    }
    if (!grant || grant.redirectUri !== form.get('redirect_uri')) {
      refuse('bad_verification_code', 'The code passed is incorrect or expired.');
      return;
    }
    if (grant.challenge) {
      const made = crypto.createHash('sha256').update(form.get('code_verifier') || '').digest('base64url');
      if (made !== grant.challenge) {
        refuse('bad_verification_code', 'The code_verifier does not match the code_challenge.');
        return;
      }
    }
    const token = `gho_${crypto.randomBytes(18).toString('hex')}`;
    tokens.set(token, grant.login);
    send(res, 200, { access_token: token, token_type: 'bearer', scope: 'read:org,read:user' });
    return;
  }
  if (req.method === 'GET' && url.pathname.startsWith('/api/v3/')) {
    const token = (req.headers.authorization || '').replace(/^(Bearer|token) /, '');
    const login = tokens.get(token);
    const user = login && users[login];
    if (!user) {
      send(res, 401, { message: 'Bad credentials', documentation_url: 'https://docs.github.com/rest' });
      return;
    }
    const path = url.pathname.slice('/api/v3'.length);
    if (path === '/user') {
      send(res, 200, { login, id: user.id, name: user.name, type: 'User' });
    } else if (path === '/user/orgs') {
      send(res, 200, page(user.orgs.map((org, i) => ({ login: org, id: 1000 + i })), url));
    } else if (path === '/user/teams') {
      send(res, 200, page(user.teams.map((t, i) => ({
        id: 2000 + i, slug: t.slug, name: t.slug, organization: { login: t.org },
      })), url));
    } else {
      send(res, 404, { message: 'Not Found' });
    }
    return;
  }
  send(res, 404, { message: 'Not Found' });
});
server.listen(0, '127.0.0.1', () => {
  process.stdout.write(`${JSON.stringify({ url: `https://127.0.0.1:${server.address().port}` })}\n`);
});
