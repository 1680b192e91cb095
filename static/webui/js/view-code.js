// "View code": the request the playground would send now, as curl and as Python (the openai SDK).
import { $ } from "./dom.js";

function python(model, prompt, fields) {
  const args = Object.entries(fields).map(([k, v]) => `    ${k}=${JSON.stringify(v)},`).join("\n");
  return `from openai import OpenAI

client = OpenAI(base_url="${location.origin}/v1", api_key="YOUR_KEY")  # a key from /account
completion = client.completions.create(
    model=${JSON.stringify(model)},
    prompt=${JSON.stringify(prompt)},
${args}
)
print(completion.choices[0].text)
`;
}

function curl(model, prompt, fields) {
  const body = JSON.stringify({ model, prompt, ...fields }, null, 2).replace(/'/g, "'\\''");
  return `curl ${location.origin}/v1/completions \\
  -H "Authorization: Bearer $OPENAI_API_KEY" \\
  -H "Content-Type: application/json" \\
  -d '${body}'
`;
}

/** Fill the "View code" box whenever it is opened. */
export function initViewCode({ model, prompt, fields }) {
  const box = $("view-code");
  const fill = () => {
    $("code-curl").textContent = curl(model(), prompt(), fields());
    $("code-python").textContent = python(model(), prompt(), fields());
  };
  box.addEventListener("toggle", () => { if (box.open) fill(); });
  box.addEventListener("focusin", fill);
}
