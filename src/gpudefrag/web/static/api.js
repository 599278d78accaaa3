// An offline API reference rendered from /openapi.json (FastAPI's /docs and /redoc are off: they need a CDN).
// Text only: everything from the schema goes through textContent.
"use strict";

function el(tag, cls, ...children) {
  const n = document.createElement(tag);
  if (cls) n.className = cls;
  for (const c of children.flat()) if (c !== null && c !== undefined) n.append(c instanceof Node ? c : String(c));
  return n;
}

function typeOf(schema, spec) {
  if (!schema) return "";
  if (schema.$ref) return schema.$ref.split("/").pop();
  if (schema.anyOf) return schema.anyOf.map((s) => typeOf(s, spec)).join(" | ");
  if (schema.enum) return schema.enum.map((v) => JSON.stringify(v)).join(" | ");
  if (schema.type === "array") return `${typeOf(schema.items, spec)}[]`;
  const limits = [];
  for (const k of ["minimum", "maximum", "minLength", "maxLength"]) if (k in schema) limits.push(`${k} ${schema[k]}`);
  return (schema.type || "object") + (limits.length ? ` (${limits.join(", ")})` : "") +
    ("default" in schema ? ` = ${JSON.stringify(schema.default)}` : "");
}

async function main() {
  const spec = await (await fetch("/openapi.json")).json();
  const box = document.getElementById("ops");
  box.append(el("p", "muted", spec.info.description || ""));
  for (const [path, ops] of Object.entries(spec.paths)) {
    for (const [method, op] of Object.entries(ops)) {
      const sec = el("div", "op");
      sec.dataset.op = `${method.toUpperCase()} ${path}`;
      sec.append(el("h2", null, el("code", null, `${method.toUpperCase()} ${path}`), " ", el("span", "muted", op.summary || "")));
      if (op.description) sec.append(el("p", null, op.description));
      const params = op.parameters || [];
      if (params.length) {
        const t = el("table", "params", el("tr", null, el("th", null, "parameter"), el("th", null, "in"), el("th", null, "type"), el("th", null, "description")));
        for (const p of params) {
          t.append(el("tr", null, el("td", null, el("code", null, p.name), p.required ? " *" : ""), el("td", null, p.in),
            el("td", null, typeOf(p.schema, spec)), el("td", null, p.description || (p.schema && p.schema.description) || "")));
        }
        sec.append(t);
      }
      const codes = Object.entries(op.responses || {}).map(([code, r]) => {
        const schema = r.content && r.content["application/json"] && r.content["application/json"].schema;
        return `${code} ${r.description}${schema ? ` → ${typeOf(schema, spec)}` : ""}`;
      });
      sec.append(el("ul", "muted", codes.map((c) => el("li", null, c))));
      box.append(sec);
    }
  }
  const schemas = (spec.components && spec.components.schemas) || {};
  box.append(el("h2", null, "Schemas"));
  for (const [name, s] of Object.entries(schemas)) {
    const fields = Object.entries(s.properties || {}).map(([k, v]) =>
      el("li", null, el("code", null, k), `: ${typeOf(v, spec)}`, (s.required || []).includes(k) ? "" : " (optional)"));
    box.append(el("div", "op", el("h3", null, name), el("ul", null, fields)));
  }
}

document.addEventListener("DOMContentLoaded", () => { main().catch((e) => { document.getElementById("ops").textContent = String(e); }); });
