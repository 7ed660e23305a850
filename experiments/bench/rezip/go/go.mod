module ecbench/rezip

go 1.19
