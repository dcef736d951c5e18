// The OpenAI Node SDK's own retries of a 429: one completion whose prompt
// and max_tokens the decode worker's KV can never hold beside nothing
// (TestOpenAISDKRetriedRefusal), sent twice as two separate calls, each
// retried by the SDK (maxRetries 2, the SDK's default) with the
// Retry-After the coordinator sends. A fetch wrapper records each try's
// X-Stainless-Retry-Count. Prints {calls: [{status, tries}]}.
import OpenAI from 'openai';

const tries = [];
const client = new OpenAI({
  baseURL: process.env.OPENAI_BASE_URL, apiKey: process.env.OPENAI_API_KEY, maxRetries: 2, timeout: 60_000,
  fetch: async (url, init) => {
    const h = new Headers(init?.headers);
    tries.push(h.get('x-stainless-retry-count'));
    return fetch(url, init);
  },
});
const calls = [];
for (let i = 0; i < 2; i++) {
  tries.length = 0;
  let status = 200;
  try {
    await client.completions.create({ model: process.env.PDSERVE_MODEL, prompt: '0123456789', max_tokens: 100, temperature: 0 });
  } catch (e) {
    status = e.status ?? -1;
  }
  calls.push({ status, tries: [...tries] });
}
console.log(JSON.stringify({ calls }));
