// The kubelet's DRA calls, made as its DRA manager makes them (grpc-go over the driver's Unix socket,
// k8s.io/kubelet's generated v1 client): for each claim named on stdin ("namespace name uid" per
// line), NodePrepareResources then NodeUnprepareResources, each with one claim. One JSON line per
// claim on stdout: the prepare and unprepare round trips in microseconds, and any error.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
)

func main() {
	socket := flag.String("socket", "", "the driver's DRA socket")
	flag.Parse()
	conn, err := grpc.NewClient("unix://"+*socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	client := drapb.NewDRAPluginClient(conn)
	out := json.NewEncoder(os.Stdout)
	lines := bufio.NewScanner(os.Stdin)
	for lines.Scan() {
		fields := strings.Fields(lines.Text())
		if len(fields) != 3 {
			continue
		}
		claim := &drapb.Claim{Namespace: fields[0], Name: fields[1], Uid: fields[2]}
		ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
		start := time.Now()
		prepared, err := client.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{claim}})
		prepare := time.Since(start)
		problem := ""
		if err != nil {
			problem = err.Error()
		} else if result := prepared.Claims[claim.Uid]; result == nil || result.Error != "" || len(result.Devices) == 0 {
			problem = fmt.Sprintf("prepare answered %v", result)
		}
		start = time.Now()
		_, err = client.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{claim}})
		unprepare := time.Since(start)
		cancel()
		if err != nil && problem == "" {
			problem = err.Error()
		}
		_ = out.Encode(map[string]any{"uid": claim.Uid, "prepare_us": prepare.Microseconds(),
			"unprepare_us": unprepare.Microseconds(), "error": problem})
	}
}
