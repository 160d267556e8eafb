class GraphModule(torch.nn.Module):
    def forward(self, primals_1: "f32[8, 8]", primals_2: "f32[8, 8]", primals_3: "f32[4, 8]"):
        # File: /models/mlp.py:10 in forward, code: h = x @ w1.t()
        t: "f32[8, 8]" = torch.ops.aten.t.default(primals_1);  primals_1 = None
        mm: "f32[4, 8]" = torch.ops.aten.mm.default(primals_3, t);  t = None
        # File: /models/mlp.py:11 in forward, code: a = gelu(h)
        gelu: "f32[4, 8]" = torch.ops.aten.gelu.default(mm)
        # File: /models/mlp.py:12 in forward, code: y = a @ w2.t()
        t_1: "f32[8, 8]" = torch.ops.aten.t.default(primals_2);  primals_2 = None
        mm_1: "f32[4, 8]" = torch.ops.aten.mm.default(gelu, t_1);  gelu = t_1 = None
        # File: /models/mappings.py:20 in reduce, code: return all_reduce(y)
        all_reduce: "f32[4, 8]" = torch.ops._c10d_functional.all_reduce.default(mm_1, 'sum', '0')
        wait_tensor: "f32[4, 8]" = torch.ops._c10d_functional.wait_tensor.default(all_reduce);  all_reduce = None
        return [wait_tensor, mm]
