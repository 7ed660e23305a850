module ecpatch/goflate-ref

go 1.19
