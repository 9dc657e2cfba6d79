// The OpenID provider the tests sign in with: the certified `oidc-provider` package over HTTPS
// on a free loopback port, configured from $OIDC_CONFIG (JSON):
//   {cert, key: PEM; clients: [oidc-provider client metadata]; users: {login: claims}}
// Its sign-in page is oidc-provider's development one: any user in `users`, any password.
// It prints {"issuer": "https://127.0.0.1:PORT"} on its first line once it listens.
//
// Two test hooks, under /__test/ (this is a test double's control channel, not OIDC):
//   POST /__test/users   {login: claims}  replaces the users (groups change, users go away)
//   POST /__test/tamper  {"mode": M}      the next ID tokens the token endpoint sends are
//     altered: "aud" (another audience), "iss" (another issuer), "exp" (expired an hour ago),
//     "sig" (a signature byte changed), "key" (signed by another key of the same kid);
//     "" stops.
import https from 'node:https';
import Provider from 'oidc-provider';
import * as jose from 'jose';

const config = JSON.parse(process.env.OIDC_CONFIG);
let users = config.users;
let tamper = '';

const { privateKey } = await jose.generateKeyPair('RS256', { extractable: true });
const signing = { ...(await jose.exportJWK(privateKey)), kid: 'k1', alg: 'RS256', use: 'sig' };
const other = (await jose.generateKeyPair('RS256', { extractable: true })).privateKey;

async function forge(idToken, issuer) {
  const claims = jose.decodeJwt(idToken);
  if (tamper === 'sig') {
    const [h, p, s] = idToken.split('.');
    const bytes = Buffer.from(s, 'base64url');
    bytes[0] ^= 1;
    return [h, p, bytes.toString('base64url')].join('.');
  }
  if (tamper === 'aud') claims.aud = 'another-client';
  if (tamper === 'iss') claims.iss = `${issuer}/elsewhere`;
  if (tamper === 'exp') {
    claims.iat -= 7200;
    claims.exp = Math.floor(Date.now() / 1000) - 3600;
  }
  const key = tamper === 'key' ? other : privateKey;
  return new jose.SignJWT(claims).setProtectedHeader({ alg: 'RS256', kid: 'k1' }).sign(key);
}

async function body(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  return JSON.parse(Buffer.concat(chunks).toString() || '{}');
}

let handler = (_req, res) => { res.statusCode = 503; res.end(); };
const server = https.createServer({ cert: config.cert, key: config.key }, (req, res) => handler(req, res));
server.listen(0, '127.0.0.1', () => {
  const issuer = `https://127.0.0.1:${server.address().port}`;
  const provider = new Provider(issuer, {
    clients: config.clients,
    jwks: { keys: [signing] },
    async findAccount(_ctx, id) {
      if (!users[id]) return undefined;
      return { accountId: id, claims: async () => ({ sub: id, ...users[id] }) };
    },
    claims: {
      openid: ['sub'],
      profile: ['name', 'preferred_username'],
      email: ['email', 'email_verified'],
      groups: ['groups'],
    },
    scopes: ['openid', 'offline_access', 'profile', 'email', 'groups'],
    features: { devInteractions: { enabled: true }, rpInitiatedLogout: { enabled: true } },
    // Claims asked for by scope go to the userinfo endpoint, not the ID token (OIDC Core
    // 5.4): the hub must read groups from there.
    conformIdTokenClaims: true,
    cookies: { keys: ['drover-test-cookie-key'] },
  });
  provider.use(async (ctx, next) => {
    if (ctx.path === '/__test/users' && ctx.method === 'POST') {
      users = await body(ctx.req);
      ctx.status = 204;
      return;
    }
    if (ctx.path === '/__test/tamper' && ctx.method === 'POST') {
      tamper = (await body(ctx.req)).mode || '';
      ctx.status = 204;
      return;
    }
    await next();
    if (tamper && ctx.path === '/token' && ctx.body && ctx.body.id_token) {
      ctx.body = { ...ctx.body, id_token: await forge(ctx.body.id_token, issuer) };
    }
  });
  handler = provider.callback();
  process.stdout.write(`${JSON.stringify({ issuer })}\n`);
});
