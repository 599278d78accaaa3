// Command fakegpu-plugin advertises N fake GPUs as nvidia.com/gpu to the kubelet through the device-plugin API
// (v1beta1), so real test nodes take GPU requests the way a node with NVIDIA's plugin does. Allocation hands the
// container NVIDIA_VISIBLE_DEVICES with the chosen IDs and nothing else: there is no device to mount.
// It re-registers whenever the kubelet restarts (the kubelet deletes every plugin socket when it starts).
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

type plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	devices []*pluginapi.Device
	stop    chan struct{}
}

func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (p *plugin) ListAndWatch(_ *pluginapi.Empty, s grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: p.devices}); err != nil {
		return err
	}
	select { // the fake devices never change health: hold the stream open until the kubelet or we go
	case <-s.Context().Done():
	case <-p.stop:
	}
	return nil
}

func (p *plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, c := range req.ContainerRequests {
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": strings.Join(c.DevicesIds, ",")},
		})
	}
	return resp, nil
}

// serve listens on dir/name, registers with the kubelet's socket in dir, and returns once our socket is gone
// (the kubelet restarted and removed it) or the server failed.
func serve(dir, name, resource string, p *plugin) error {
	sock := filepath.Join(dir, name)
	_ = os.Remove(sock)
	lis, err := net.Listen("unix", sock)
	if err != nil {
		return err
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(lis) }()
	defer srv.Stop()

	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, "kubelet.sock"),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: name, ResourceName: resource,
	})
	cancel()
	conn.Close()
	if err != nil {
		return fmt.Errorf("register with the kubelet: %w", err)
	}
	log.Printf("registered %s with %d devices on %s", resource, len(p.devices), sock)
	for {
		select {
		case err := <-done:
			return err
		case <-time.After(time.Second):
			if _, err := os.Stat(sock); err != nil {
				log.Printf("%s is gone (kubelet restarted): registering again", sock)
				return nil
			}
		}
	}
}

func main() {
	dir := flag.String("dir", pluginapi.DevicePluginPath, "the kubelet's device-plugin folder")
	count := flag.Int("count", 8, "how many fake GPUs to advertise")
	resource := flag.String("resource", "nvidia.com/gpu", "the extended resource name")
	name := flag.String("socket", "gpudefrag-fakegpu.sock", "this plugin's socket name in -dir")
	prefix := flag.String("id-prefix", "GPU-fake-", "device ID prefix")
	flag.Parse()
	p := &plugin{stop: make(chan struct{})}
	for i := 0; i < *count; i++ {
		p.devices = append(p.devices, &pluginapi.Device{ID: fmt.Sprintf("%s%d", *prefix, i), Health: pluginapi.Healthy})
	}
	for {
		if err := serve(*dir, *name, *resource, p); err != nil {
			log.Printf("%v; retrying in 1 s", err)
		}
		close(p.stop) // end the old ListAndWatch streams
		p.stop = make(chan struct{})
		time.Sleep(time.Second)
	}
}
