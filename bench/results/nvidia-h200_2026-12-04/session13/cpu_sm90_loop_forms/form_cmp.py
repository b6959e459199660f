import sys, re, collections
sys.path.insert(0,"tools"); sys.path.insert(0,".")
import sm90_split_kernel_ab as AB
from qsa_jax import arg_specs
induction = {"none": None, "true": True, "false": False}[sys.argv[1]]
for tp,rows,launches in (("TP1",1,[(32,64,4)]),("TP4",8,[(32,64,4)]),("TP1",64,[(32,4,1)]),("TP1",512,[(64,1,2),(32,2,1)]),("TP4",512,[(64,4,2),(32,4,1)])):
    geo=arg_specs.GEOMETRIES[tp]
    for bn,sp,w in launches:
        for fp8 in (False, True):
            k=AB.ours(geo,rows,bn,sp,w,"jit",fp8=fp8,induction=induction)
            o=AB.compiled_numbers(k,"/tmp/f.ptx")
            sass=open("/tmp/f.ptx.cubin.sass").read()
            ops=[t.split()[0] for t in re.findall(r"/\*[0-9a-f]{4,6}\*/\s+(?:@!?U?P\w+\s+)?(\S+)", sass)]
            print(f"{tp} r{rows} {bn}/{sp}/{w} {'fp8' if fp8 else 'bf16'}: regs {o['registers']} spill {o['spill_stores']} loop {o['loop_length']} sass {len(ops)} h{__import__("hashlib").md5(" ".join(ops).encode()).hexdigest()[:10]}", flush=True)
