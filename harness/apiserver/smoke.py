#!/usr/bin/env python3
"""Smoke check of clb-test-apiserver (stdlib only): readyz, version, a Service created and listed
as admin, RBAC on a ServiceAccount token, exit on stdin EOF and on SIGTERM with no temp dir left.
Usage: smoke.py [BINARY]   (default: the path build.sh prints)"""
import subprocess, time, json, base64, ssl, urllib.request, urllib.error, os, sys, glob, tempfile
binary = sys.argv[1] if len(sys.argv) > 1 else subprocess.run([os.path.join(os.path.dirname(os.path.abspath(__file__)), "build.sh")], check=True, capture_output=True, text=True).stdout.strip()
work = tempfile.mkdtemp(prefix="clb-smoke-")
t0=time.time()
p=subprocess.Popen([binary,"-kubeconfig",work+"/kubeconfig","-log",work+"/apiserver.log"],stdin=subprocess.PIPE,stdout=subprocess.PIPE,text=True)
line=p.stdout.readline().strip()
print(f"{time.time()-t0:.2f}s: {line!r}")
_,kc,url=line.split()
cfg=open(kc).read()
tok=[l.split()[1] for l in cfg.splitlines() if "token:" in l][0]
ca=base64.b64decode([l.split()[1] for l in cfg.splitlines() if "certificate-authority-data" in l][0]).decode()
ctx=ssl.create_default_context(cadata=ca)
def req(method,path,body=None,token=tok):
    r=urllib.request.Request(url+path,method=method,data=json.dumps(body).encode() if body else None,headers={"Content-Type":"application/json",**({"Authorization":"Bearer "+token} if token else {})})
    try:
        with urllib.request.urlopen(r,context=ctx) as resp: return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e: return e.code, e.read().decode()
print("readyz", req("GET","/readyz"))
print("version", json.loads(req("GET","/version")[1])["gitVersion"])
s,b=req("POST","/api/v1/namespaces/default/services",{"apiVersion":"v1","kind":"Service","metadata":{"name":"storefront"},"spec":{"type":"LoadBalancer","externalTrafficPolicy":"Local","ports":[{"port":80,"targetPort":8080,"protocol":"TCP"}],"selector":{"app":"storefront"}}})
d=json.loads(b); print("create service", s, d["metadata"]["name"], d["spec"].get("clusterIP"), "healthCheckNodePort", d["spec"].get("healthCheckNodePort"))
s,b=req("GET","/api/v1/namespaces/default/services"); print("list services", s, [i["metadata"]["name"] for i in json.loads(b)["items"]])
# limited identity: a ServiceAccount with a bound token
print("create sa", req("POST","/api/v1/namespaces/default/serviceaccounts",{"metadata":{"name":"clb"}})[0])
s,b=req("POST","/api/v1/namespaces/default/serviceaccounts/clb/token",{"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","spec":{"audiences":["https://kubernetes.default.svc.cluster.local"],"expirationSeconds":3600}})
satok=json.loads(b)["status"]["token"]; print("token request", s)
print("sa list services (no RBAC yet)", req("GET","/api/v1/namespaces/default/services",token=satok)[0])
print("role", req("POST","/apis/rbac.authorization.k8s.io/v1/namespaces/default/roles",{"metadata":{"name":"svc-read"},"rules":[{"apiGroups":[""],"resources":["services"],"verbs":["get","list","watch"]}]})[0])
print("binding", req("POST","/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings",{"metadata":{"name":"clb-svc-read"},"roleRef":{"apiGroup":"rbac.authorization.k8s.io","kind":"Role","name":"svc-read"},"subjects":[{"kind":"ServiceAccount","name":"clb","namespace":"default"}]})[0])
for i in range(20):
    s,_=req("GET","/api/v1/namespaces/default/services",token=satok)
    if s==200: break
    time.sleep(0.1)
print("sa list services (with role)", s)
print("sa delete service (not granted)", req("DELETE","/api/v1/namespaces/default/services/storefront",token=satok)[0])
print("anonymous list", req("GET","/api/v1/namespaces/default/services",token=None)[0])
tmp=glob.glob("/tmp/clb-test-apiserver-*"); print("temp dirs while running", tmp)
t1=time.time(); p.stdin.close(); rc=p.wait(timeout=30)
print(f"stdin closed -> exit rc={rc} in {time.time()-t1:.2f}s; temp dirs left {glob.glob('/tmp/clb-test-apiserver-*')}; kubeconfig left {os.path.exists(kc)}")
# SIGTERM path
p=subprocess.Popen([binary,"-log",work+"/apiserver2.log"],stdin=subprocess.PIPE,stdout=subprocess.PIPE,text=True)
t0=time.time(); line=p.stdout.readline().strip(); print(f"second start {time.time()-t0:.2f}s: {line!r}")
t1=time.time(); p.terminate(); rc=p.wait(timeout=30)
print(f"SIGTERM -> exit rc={rc} in {time.time()-t1:.2f}s; temp dirs left {glob.glob('/tmp/clb-test-apiserver-*')}")
