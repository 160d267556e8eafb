class GraphModule(torch.nn.Module):
    def forward(self, primals_1: "f32[16, 8]", primals_2: "f32[8, 16]", primals_3: "f32[4, 8]"):
        # File: /models/mlp.py:10 in forward, code: h = x @ w1.t()
        t: "f32[8, 16]" = torch.ops.aten.t.default(primals_1);  primals_1 = None
        mm: "f32[4, 16]" = torch.ops.aten.mm.default(primals_3, t);  t = None
        # File: /models/mlp.py:11 in forward, code: a = gelu(h)
        gelu: "f32[4, 16]" = torch.ops.aten.gelu.default(mm)
        # File: /models/mlp.py:12 in forward, code: y = a @ w2.t()
        t_1: "f32[16, 8]" = torch.ops.aten.t.default(primals_2);  primals_2 = None
        mm_1: "f32[4, 8]" = torch.ops.aten.mm.default(gelu, t_1);  gelu = t_1 = None
        return [mm_1, mm]
