// Evaluates IAM requests with @cloud-copilot/iam-simulate (package.json devDependencies, pinned).
// stdin: a JSON list of {name, principal, identityPolicies: [policy...], action, resource, account, context,
// resourcePolicy?, endpointPolicy?}.
// stdout: a JSON object {name: "Allowed" | "ImplicitlyDenied" | "ExplicitlyDenied" | "error: ..."}.
// One process for the whole matrix: node starts once, the service data loads once.
import { runSimulation } from '@cloud-copilot/iam-simulate'

const chunks = []
for await (const chunk of process.stdin) chunks.push(chunk)
const requests = JSON.parse(Buffer.concat(chunks).toString('utf8'))
const results = {}
for (const r of requests) {
  const simulation = {
    request: {
      principal: r.principal,
      action: r.action,
      resource: { resource: r.resource, accountId: r.account },
      contextVariables: r.context || {},
    },
    identityPolicies: r.identityPolicies.map((policy, i) => ({ name: `policy${i}`, policy })),
    serviceControlPolicies: [],
    resourceControlPolicies: [],
    resourcePolicy: r.resourcePolicy,
    vpcEndpointPolicies: r.endpointPolicy ? [{ name: 'endpoint', policy: r.endpointPolicy }] : undefined,
  }
  const response = await runSimulation(simulation, {})
  results[r.name] = response.resultType === 'error'
    ? `error: ${JSON.stringify(response.errors)}`
    : response.overallResult
}
process.stdout.write(JSON.stringify(results))
