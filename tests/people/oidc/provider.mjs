// A real OpenID Provider for the single sign-on tests: panva's certified oidc-provider, its development
// interactions (a login form taking any name that the claims file knows, then a consent form), one confidential
// client whose redirect URI the test names, a fresh RSA signing key per process, and each person's claims read
// from CLAIMS_FILE at every sign-in (a test edits the file to change someone's groups).
// Listens on a free port of 127.0.0.1 and prints that port as its first line of output.
// /tampered/.well-known/openid-configuration is the real discovery document naming another issuer
// (issuer + "/tampered"): what a gateway pointed at a forged document sees.
import { readFileSync } from 'node:fs';
import { generateKeyPairSync } from 'node:crypto';
import { createServer } from 'node:http';
import Provider from 'oidc-provider';

const { CLAIMS_FILE, REDIRECT_URI, CLIENT_ID, CLIENT_SECRET, ISSUER_HOST = '127.0.0.1' } = process.env;
const server = createServer();
await new Promise((resolve) => { server.listen(0, '127.0.0.1', resolve); });
// ISSUER_HOST=localhost makes the provider another site than an appliance at 127.0.0.1, as in real life.
const issuer = `http://${ISSUER_HOST}:${server.address().port}`;
const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });

const provider = new Provider(issuer, {
  clients: [{
    client_id: CLIENT_ID,
    client_secret: CLIENT_SECRET,
    redirect_uris: [REDIRECT_URI],
    grant_types: ['authorization_code'],
    response_types: ['code'],
  }],
  jwks: { keys: [{ ...privateKey.export({ format: 'jwk' }), kid: 'test-signing-key', use: 'sig', alg: 'RS256' }] },
  claims: { openid: ['sub'], profile: ['preferred_username', 'name', 'groups'], email: ['email'] },
  conformIdTokenClaims: false, // the profile claims (groups among them) go into the ID token, as Keycloak's mappers do
  cookies: { keys: ['cookie-key-for-tests'] },
  async findAccount(ctx, sub) {
    const people = JSON.parse(readFileSync(CLAIMS_FILE, 'utf8'));
    if (!Object.hasOwn(people, sub)) return undefined;
    return { accountId: sub, async claims() { return { sub, ...people[sub] }; } };
  },
});

provider.use(async (ctx, next) => {
  if (ctx.path !== '/tampered/.well-known/openid-configuration') return next();
  ctx.path = '/.well-known/openid-configuration';
  await next();
  ctx.body = { ...ctx.body, issuer: `${issuer}/tampered` };
  return undefined;
});

server.on('request', provider.callback());
process.stdout.write(`${server.address().port}\n`);
