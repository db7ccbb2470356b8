// An unmodified controller on the official JavaScript client's informer (@kubernetes/client-node),
// with no rangeshard code: for every ConfigMap labelled app=ext in the namespace given as the first
// argument, it sets data.done to data.want and data.by to the instance it runs under
// (RANGESHARD_INSTANCE_ID, set by the manager). The informer relists on a 410 by itself; on any
// other error it is restarted, as the client's documentation shows.
import * as k8s from '@kubernetes/client-node';

const ns = process.argv[2];
const me = process.env.RANGESHARD_INSTANCE_ID ?? '?';
const kc = new k8s.KubeConfig();
kc.loadFromDefault(); // KUBECONFIG: the manager's endpoint
const api = kc.makeApiClient(k8s.CoreV1Api);

async function handle(cm) {
  const data = cm.data ?? {};
  if (data.want === undefined || (data.done === data.want && data.by !== undefined)) return;
  try {
    await api.patchNamespacedConfigMap(
      { name: cm.metadata.name, namespace: ns, body: { data: { done: data.want, by: me } } },
      k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.MergePatch),
    );
  } catch (e) {
    // A fenced write (409) after a handover, the endpoint restarting: the next event or relist retries.
    console.log(`patch ${cm.metadata.name} failed: ${e.code ?? e.message}`);
  }
}

const path = `/api/v1/namespaces/${ns}/configmaps`;
const list = () => api.listNamespacedConfigMap({ namespace: ns, labelSelector: 'app=ext' });
const informer = k8s.makeInformer(kc, path, list, 'app=ext');
informer.on('connect', () => console.log('informer (re)connecting'));
informer.on('add', (cm) => { console.log(`add ${cm.metadata.name}`); return handle(cm); });
informer.on('update', handle);
informer.on('error', (err) => {
  console.log(`informer error: ${err?.message ?? err}; restarting`);
  setTimeout(() => informer.start(), 500);
});
await informer.start();
console.log('informer started');
