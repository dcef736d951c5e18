// An agent of the OpenAI Agents SDK (@openai/agents) on each of its
// OpenAI models: the default (Responses API over HTTP), the Responses API
// in WebSocket mode (OpenAIResponsesWSModel) and chat completions. Each
// agent has a function tool, which its first turn must call, and a zod 4
// output type with .int(); prints one JSON object that TestAgentsSDK
// checks. Environment as openai_sdk.mjs (PDSERVE_SDK_INT as in
// openai_sdk7.mjs).
import OpenAI from 'openai';
import {
  Agent, run, tool, setTracingDisabled, setDefaultOpenAIClient, setOpenAIAPI,
  OpenAIResponsesWSModel, OpenAIChatCompletionsModel,
} from '@openai/agents';
import { z } from 'zod';

setTracingDisabled(true); // nothing leaves the machine
const client = new OpenAI({ baseURL: process.env.OPENAI_BASE_URL, apiKey: process.env.OPENAI_API_KEY, maxRetries: 0, timeout: 120_000 });
setDefaultOpenAIClient(client);
setOpenAIAPI('responses');
const model = process.env.PDSERVE_MODEL;

const days = process.env.PDSERVE_SDK_INT === '0' ? z.number() : z.number().int();
// Strings are enums: random weights fill an unbounded string until the
// token limit.
const City = z.enum(['Oslo', 'Paris', 'Rome']);
const Weather = z.object({ city: City, days, unit: z.enum(['c', 'f']), rain: z.boolean() });
const finite = (v) => typeof v === 'number' ? Number.isFinite(v)
  : Array.isArray(v) ? v.every(finite)
  : v && typeof v === 'object' ? Object.values(v).every(finite) : true;

const calls = [];
const getWeather = tool({
  name: 'get_weather',
  description: 'The weather of a city.',
  parameters: z.object({ city: City }),
  execute: async ({ city }) => { calls.push(city); return `sunny in ${city}`; },
});

async function agentRun(name, agentModel) {
  calls.length = 0;
  const agent = new Agent({
    name, model: agentModel, instructions: 'Call get_weather, then answer.',
    tools: [getWeather], outputType: Weather,
    // The first turn must call the tool; then (resetToolChoice) the
    // choice is the model's, under the output type's schema.
    // One call a turn (parallelToolCalls false), so the run's shape is
    // known on random weights: the server holds the model to it.
    modelSettings: { toolChoice: 'required', parallelToolCalls: false, temperature: 0, maxTokens: 400 },
  });
  try {
    const r = await run(agent, 'What is the weather in Oslo?', { maxTurns: 4 });
    const parsed = Weather.safeParse(r.finalOutput);
    return {
      items: r.newItems.map((i) => i.type), calls: [...calls],
      output: r.finalOutput ?? null, valid: parsed.success, finite: finite(r.finalOutput),
      issues: parsed.success ? [] : parsed.error.issues.map((i) => i.path.join('.') + ': ' + i.message),
      responses: r.rawResponses.length,
    };
  } catch (e) {
    return { error: { name: e?.constructor?.name, message: String(e?.message ?? e), status: e?.status ?? null } };
  }
}

// The WebSocket model uses the global WebSocket: count its sockets and
// the response.create events sent on them.
const sockets = [];
const NativeWebSocket = globalThis.WebSocket;
globalThis.WebSocket = class extends NativeWebSocket {
  constructor(url, ...rest) {
    super(url, ...rest);
    const s = { url: String(url), creates: 0 };
    sockets.push(s);
    const send = this.send.bind(this);
    this.send = (data) => {
      if (typeof data === 'string' && JSON.parse(data).type === 'response.create') s.creates++;
      return send(data);
    };
  }
};

const out = {};
out.responses = await agentRun('responses', model);
const wsModel = new OpenAIResponsesWSModel(client, model);
out.websocket = await agentRun('websocket', wsModel);
out.websocket.sockets = sockets.map((s) => ({ path: new URL(s.url).pathname, scheme: new URL(s.url).protocol, creates: s.creates }));
await wsModel.close?.();
out.chat = await agentRun('chat', new OpenAIChatCompletionsModel(client, model));
console.log(JSON.stringify(out));
process.exit(0); // the WebSocket model's socket may keep the loop alive
