// A real OpenID provider for gpusweep's single sign-on tests: panva's certified oidc-provider with
// one confidential client, users with groups and passwords from a JSON file (re-read at every
// request, so a test removes a group "at the provider" by rewriting the file), a plain login form
// (no consent page: the client is first-party) and RP-initiated logout.
//
//   node tests/oidc/provider.js CONFIG.json
// CONFIG: {"client": {client_id, client_secret, redirect_uris, post_logout_redirect_uris},
//          "users_file": "/path/users.json"}
// users.json: {"alice": {"password": "...", "sub": "...", "email": "...", "groups": ["..."], ...}}
// Listens on a free port of 127.0.0.1 and prints {"issuer": "http://127.0.0.1:PORT"} when ready.
import { generateKeyPairSync, randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import http from 'node:http';

import Provider from 'oidc-provider';

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const users = () => JSON.parse(readFileSync(config.users_file, 'utf8'));
const bySub = (sub) => Object.entries(users()).find(([, user]) => user.sub === sub);

const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
const signingKey = { ...privateKey.export({ format: 'jwk' }), kid: 'test-rs256', alg: 'RS256', use: 'sig' };

const CLAIMS = {
  openid: ['sub'],
  email: ['email', 'email_verified'],
  profile: ['preferred_username', 'name', 'given_name', 'family_name'],
  groups: ['groups'],
};

const escape = (text) => String(text).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

function loginPage(uid, error) {
  return `<!doctype html><html><head><meta charset="utf-8"><title>Test IdP: sign in</title></head><body>
<h1>Test IdP</h1>${error ? `<p class="error">${escape(error)}</p>` : ''}
<form method="post" action="/interaction/${escape(uid)}/login">
<label>Username <input name="username" autocomplete="username" autofocus></label>
<label>Password <input name="password" type="password" autocomplete="current-password"></label>
<button type="submit">Sign in</button></form></body></html>`;
}

async function readForm(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  return new URLSearchParams(Buffer.concat(chunks).toString('utf8'));
}

function send(res, status, html) {
  res.writeHead(status, { 'content-type': 'text/html; charset=utf-8', 'cache-control': 'no-store' });
  res.end(html);
}

// The interaction pages (login, and consent granted at once): true when this request was one.
async function interaction(provider, req, res) {
  const match = /^\/interaction\/([\w-]+)(\/login)?$/.exec(new URL(req.url, 'http://x').pathname);
  if (!match) return false;
  const details = await provider.interactionDetails(req, res);
  if (req.method === 'POST' && match[2] && details.prompt.name === 'login') {
    const form = await readForm(req);
    const user = users()[form.get('username') || ''];
    if (!user || user.password !== form.get('password')) {
      send(res, 200, loginPage(details.uid, 'Invalid username or password.'));
      return true;
    }
    await provider.interactionFinished(req, res, { login: { accountId: user.sub } }, { mergeWithLastSubmission: false });
    return true;
  }
  if (details.prompt.name === 'login') {
    send(res, 200, loginPage(details.uid));
    return true;
  }
  // consent: a first-party client gets what it asked for
  const grant = details.grantId
    ? await provider.Grant.find(details.grantId)
    : new provider.Grant({ accountId: details.session.accountId, clientId: details.params.client_id });
  const missing = details.prompt.details;
  if (missing.missingOIDCScope) grant.addOIDCScope(missing.missingOIDCScope.join(' '));
  if (missing.missingOIDCClaims) grant.addOIDCClaims(missing.missingOIDCClaims);
  const grantId = await grant.save();
  await provider.interactionFinished(req, res, { consent: { grantId } }, { mergeWithLastSubmission: true });
  return true;
}

const server = http.createServer();
server.listen(0, '127.0.0.1', () => {
  const issuer = `http://127.0.0.1:${server.address().port}`;
  const provider = new Provider(issuer, {
    clients: [{
      response_types: ['code'],
      grant_types: ['authorization_code'],
      token_endpoint_auth_method: 'client_secret_basic',
      ...config.client,
    }],
    jwks: { keys: [signingKey] },
    cookies: { keys: [randomBytes(32).toString('hex')] },
    claims: CLAIMS,
    scopes: Object.keys(CLAIMS),
    pkce: { required: () => true },
    features: { devInteractions: { enabled: false }, rpInitiatedLogout: { enabled: true } },
    interactions: { url: (ctx, interactionObject) => `/interaction/${interactionObject.uid}` },
    async findAccount(ctx, sub) {
      const found = bySub(sub);
      if (!found) return undefined;
      const [username, user] = found;
      return {
        accountId: sub,
        async claims() {
          return {
            sub,
            preferred_username: user.preferred_username || username,
            email: user.email,
            email_verified: true,
            name: user.name,
            given_name: user.given_name,
            family_name: user.family_name,
            groups: user.groups || [],
          };
        },
      };
    },
  });
  const callback = provider.callback();
  server.on('request', (req, res) => {
    interaction(provider, req, res).then((done) => {
      if (!done) callback(req, res);
    }).catch((err) => {
      console.error(err);
      if (!res.headersSent) send(res, 500, escape(err.message));
    });
  });
  process.stdout.write(`${JSON.stringify({ issuer })}\n`);
});

for (const signal of ['SIGTERM', 'SIGINT']) process.on(signal, () => server.close(() => process.exit(0)));
